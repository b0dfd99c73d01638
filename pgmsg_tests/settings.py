"""Settings for pgmsg's own tests: DATABASE_URL, or an embedded PostgreSQL in .pgdata/."""

from pathlib import Path

from pgmsg.devdb import default_database

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "pgmsg-tests-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "pgmsg_tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "pgtrigger",
    "pgmsg",
    "pgmsg_tests.testapp",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
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

DATABASES = {"default": default_database(BASE_DIR / ".pgdata", name="pgmsg")}

PGMSG = {"SWEEP_INTERVAL": 1.0, "RETRY_BACKOFF": 0.05, "RETRY_BACKOFF_MAX": 0.2}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"pgmsg": {"handlers": ["console"], "level": "WARNING"}},
}
