"""A small shop that uses pgmsg the way a user would. Database: DATABASE_URL or embedded."""

from pathlib import Path

from pgmsg_dev.devdb import default_database

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "example-project-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["localhost", "127.0.0.1"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "example_project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

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
    "example_project.shop",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
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
STATIC_URL = "static/"

# The embedded server keeps its data in .pgdata/ at the top of the checkout (git-ignored).
DATABASES = {"default": default_database(BASE_DIR / ".pgdata", name="pgmsg_example")}

PGMSG = {"MAX_ATTEMPTS": 3, "RETRY_BACKOFF": 0.2, "SWEEP_INTERVAL": 1.0}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"pgmsg": {"handlers": ["console"], "level": "WARNING"}},
}
