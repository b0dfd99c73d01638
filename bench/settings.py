"""Benchmark settings: the test settings plus the bench app, on DATABASE_URL."""

from pgmsg_tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench.benchapp"]  # noqa: F405
LOGGING = {"version": 1, "disable_existing_loggers": False}
PGMSG = {}  # the documented defaults
