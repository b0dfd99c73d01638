from django.apps import AppConfig


class BenchappConfig(AppConfig):
    name = "bench.benchapp"
    label = "benchapp"
