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


def test_a_setting_whose_default_is_zero_may_be_set_to_zero_and_no_lower():
    # ARCHIVE_INTERVAL 0 means no periodic runs, as docs/settings.md says.
    with override_settings(PGMSG={"ARCHIVE_INTERVAL": 0}):
        assert conf.get().ARCHIVE_INTERVAL == 0
    with override_settings(PGMSG={"ARCHIVE_INTERVAL": -1}):
        with pytest.raises(errors.ConfigurationError, match="must be a non-negative float"):
            conf.get()


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


@pytest.mark.django_db
def test_the_project_passes_its_checks():
    # The migrated test database: pgmsg.E010 (migrations not applied) asks it.
    call_command("check", stdout=StringIO())


@pytest.mark.django_db
def test_migrations_match_the_models():
    call_command("makemigrations", "--check", "--dry-run", stdout=StringIO())


@pytest.mark.django_db
@pytest.mark.processes
def test_the_bench_settings_pass_the_checks():
    """`make bench` starts `listen` processes with bench/settings.py: a setting the test
    settings gain (a destination's secret) and the bench's lack stopped every one of them."""
    import subprocess
    import sys

    from django.db import connection

    from pgmsg_dev.devdb import database_url
    from pgmsg_tests.conftest import ROOT

    env = {
        **__import__("os").environ,
        "DATABASE_URL": database_url(connection.settings_dict),
        "DJANGO_SETTINGS_MODULE": "bench.settings",
    }
    done = subprocess.run(
        [sys.executable, "-m", "django", "check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
