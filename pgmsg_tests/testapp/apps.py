from django.apps import AppConfig


class TestappConfig(AppConfig):
    name = "pgmsg_tests.testapp"
    label = "testapp"
