from django.apps import AppConfig


class ServiceBConfig(AppConfig):
    name = "pgmsg_tests.testapp.service_b"
    label = "pgmsg_tests_service_b"
