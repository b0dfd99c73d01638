"""Settings for pgmsg's own tests: DATABASE_URL, or an embedded PostgreSQL in .pgdata/."""

import json
import os
from pathlib import Path

from pgmsg_dev.devdb import default_database, logical_database

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "pgmsg-tests-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "pgmsg_tests.urls"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# The tests make users with passwords; the default hasher (PBKDF2, over a million rounds) costs
# a quarter of a second each, and no test is about hashing.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",  # pgmsg uses ArrayField (Django 6.0 checks for this app)
    "pgtrigger",
    "pgmsg",
    "pgmsg_tests.testapp",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# PGMSG_TEST_DATABASE: a database name of one's own on the embedded server (nox cells use it).
_DATABASE_NAME = os.environ.get("PGMSG_TEST_DATABASE", "pgmsg")
_EXTERNAL = bool(os.environ.get("DATABASE_URL"))  # read before default_database() exports one
DATABASES = {"default": default_database(BASE_DIR / ".pgdata", name=_DATABASE_NAME)}
# The outbox's logical capture mode needs wal_level = logical: the embedded server has it; a
# server given by DATABASE_URL may not (CI's PostgreSQL 15), so its tests of that mode use a
# private embedded server in .pgdata-logical/ (pgmsg_tests/outbox/test_logical.py).
DATABASES["logical"] = logical_database(
    BASE_DIR / ".pgdata-logical",
    default=DATABASES["default"],
    external=_EXTERNAL,
    name=_DATABASE_NAME,
)

# Outbox destinations: the brokers on this machine; a process test points one at its TCP proxy
# through PGMSG_TEST_DESTINATIONS (a JSON object merged over these).
OUTBOX_DESTINATIONS = {
    "rabbit": "amqp://guest:guest@127.0.0.1:5672/%2F",
    "jetstream": "nats://127.0.0.1:4222",
    "redis": "redis://127.0.0.1:6379/0",
    "mqtt": "mqtt://127.0.0.1:1883",
    "recorder": "pgmsg_tests.testapp.outbox_declarations.record",
    # A test points it at its own HTTP server (override_settings or PGMSG_TEST_DESTINATIONS).
    "webhook": "http://127.0.0.1:9/hook",
    **json.loads(os.environ.get("PGMSG_TEST_DESTINATIONS", "{}")),
}

PGMSG = {
    "SWEEP_INTERVAL": 1.0,
    "RETRY_BACKOFF": 0.05,
    "RETRY_BACKOFF_MAX": 0.2,
    "RECONNECT_BACKOFF_MAX": 1.0,
    "OUTBOX_DESTINATIONS": OUTBOX_DESTINATIONS,
    "OUTBOX_PUBLISH_TIMEOUT": 3.0,
    "OUTBOX_HTTP_SECRETS": {"webhook": "outbox-test-secret"},
    # A frozen worker's batch goes back after this (tests freeze workers with SIGSTOP).
    "WORKER_IDLE_TIMEOUT": 3.0,
    # A process test may give its workers other values (a JSON object merged over these).
    **json.loads(os.environ.get("PGMSG_TEST_SETTINGS", "{}")),
}
# PGMSG_TEST_THROUGH_DJANGO_CURSOR=1 (nox -s through_django_cursor): the suite with the wire
# layer's fast path off, every producer and batch statement through Django's cursor; the tests
# of that path itself (marked wire_fast_path) are skipped then.
THROUGH_DJANGO_CURSOR = os.environ.get("PGMSG_TEST_THROUGH_DJANGO_CURSOR") == "1"
if THROUGH_DJANGO_CURSOR:
    PGMSG["SEND_THROUGH_DJANGO_CURSOR"] = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    # A process test may ask its workers for INFO lines (to wait for one).
    "loggers": {
        "pgmsg": {
            "handlers": ["console"],
            "level": os.environ.get("PGMSG_TEST_LOG_LEVEL", "WARNING"),
        }
    },
}
