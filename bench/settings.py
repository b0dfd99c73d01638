"""Benchmark settings: the test settings plus the bench app, on DATABASE_URL."""

from pgmsg_tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench.benchapp"]  # noqa: F405
LOGGING = {"version": 1, "disable_existing_loggers": False}
# The documented defaults, and the brokers of this machine (from the test settings).
PGMSG = {"OUTBOX_DESTINATIONS": OUTBOX_DESTINATIONS}  # noqa: F405
