"""System checks, settings validation, and migrations that match the models."""

from io import StringIO

import pytest
from django.core.management import call_command
from django.test import override_settings

from pgmsg import checks
from pgmsg.core import conf, errors


def ids(problems):
    return [p.id for p in problems]


def test_settings_have_documented_defaults():
    assert conf.Settings().BATCH_SIZE == 100 and conf.Settings().MAX_ATTEMPTS == 5


@override_settings(PGMSG={"BATCH_SIZE": 0})
def test_bad_setting_value_is_reported():
    with pytest.raises(
        errors.ConfigurationError, match=r"PGMSG\['BATCH_SIZE'\] must be a positive int"
    ):
        conf.get()
    assert ids(checks.check_settings()) == ["pgmsg.E003"]


@override_settings(PGMSG={"BATCH_SIZ": 10})
def test_unknown_setting_is_reported():
    with pytest.raises(errors.ConfigurationError, match="Unknown PGMSG setting"):
        conf.get()


def test_a_database_that_is_not_postgresql_is_an_error(settings):
    from django.db import connections

    settings.DATABASES = {
        **settings.DATABASES,
        "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    }
    settings.PGMSG = {"DATABASE": "lite"}

    def reread_databases():
        connections.__dict__.pop("settings", None)
        connections._settings = None

    reread_databases()
    try:
        problems = checks.check_database()
    finally:
        settings.DATABASES = {k: v for k, v in settings.DATABASES.items() if k != "lite"}
        reread_databases()
    assert ids(problems) == ["pgmsg.E002"]
    assert "needs PostgreSQL" in problems[0].msg and "'sqlite'" in problems[0].msg


@override_settings(PGMSG={"DATABASE": "nope"})
def test_an_unknown_database_alias_is_an_error():
    assert ids(checks.check_database()) == ["pgmsg.E001"]


def test_listeners_of_undeclared_channels_are_reported():
    from pgmsg.channels import declarations as channels

    channels.registry.add_listener("test.typo", lambda m: None)
    try:
        problems = checks.check_listeners()
    finally:
        del channels.registry.listeners["test.typo"]
    assert ids(problems) == ["pgmsg.E005"] and "test.typo" in problems[0].msg


def test_the_project_passes_its_checks():
    call_command("check", stdout=StringIO())


@pytest.mark.django_db
def test_migrations_match_the_models():
    call_command("makemigrations", "--check", "--dry-run", stdout=StringIO())
