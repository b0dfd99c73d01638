"""The migrations: one squash of 0001..0030 (pgmsg/migrations/README.md) makes a fresh
database's partitioned tables, and a database that the replaced migrations made counts it as
applied."""

import os
import subprocess
import sys

import psycopg
import pytest
from django.db import connection

from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import ROOT

# processes: each test migrates scratch databases in child `manage.py migrate` processes (slow).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

#: Suffix of the scratch database's name: named after the test database, so that two runs on
#: one shared server (each with its own test database) do not drop each other's.
SCRATCH = "_migration_path"
SQUASH = "0001_squashed_0030"


def _migrate(url: str, *args: str) -> None:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "pgmsg_tests.settings"}
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", *args, "-v", "0"],
        cwd=ROOT, env=env, check=True, timeout=300,
    )  # fmt: skip


@pytest.fixture
def scratch_url():
    name = connection.settings_dict["NAME"] + SCRATCH
    with connection.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')
        cursor.execute(f'CREATE DATABASE "{name}"')
    yield database_url(connection.settings_dict, name=name)
    with connection.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _rows(db, query: str, params: list | None = None) -> list[tuple]:
    return db.execute(query, params).fetchall()


def test_a_fresh_database_gets_the_partitioned_tables_and_the_replaced_names(scratch_url):
    _migrate(scratch_url)
    with psycopg.connect(scratch_url, autocommit=True) as db:
        kinds = _rows(
            db,
            "SELECT relname, relkind FROM pg_class WHERE relname IN "
            "('pgmsg_inbox_message', 'pgmsg_event', 'pgmsg_outbox_message') ORDER BY relname",
        )
        assert kinds == [("pgmsg_event", "p"), ("pgmsg_inbox_message", "p"),
                         ("pgmsg_outbox_message", "p")]  # fmt: skip
        # This week's (this month's) partition and the default one of each.
        for table, period, form in [
            ("pgmsg_inbox_message", "week", "YYYYMMDD"),
            ("pgmsg_outbox_message", "week", "YYYYMMDD"),
            ("pgmsg_event", "month", "YYYYMM"),
        ]:
            names = _rows(
                db,
                "SELECT %s::text || '_p' || to_char(date_trunc(%s, now() AT TIME ZONE 'UTC'), %s), "
                "%s::text || '_default'",
                [table, period, form, table],
            )[0]
            assert [to_regclass(db, name) for name in names] == list(names)
        applied = {name for (name,) in _rows(db, "SELECT name FROM django_migrations "
                                                 "WHERE app = 'pgmsg'")}  # fmt: skip
        assert {SQUASH, "0001_initial", "0030_dead_letters_apart"} <= applied
        assert len([n for n in applied if n[:4] <= "0030"]) == 31


def to_regclass(db, name: str) -> str | None:
    return _rows(db, "SELECT to_regclass(%s)::text", [name])[0][0]


def test_a_database_the_replaced_migrations_made_counts_the_squash_as_applied(scratch_url):
    # As a database migrated by 0001..0030 before the squash: their names recorded, not its.
    _migrate(scratch_url)
    with psycopg.connect(scratch_url, autocommit=True) as db:
        db.execute("DELETE FROM django_migrations WHERE app = 'pgmsg' AND name = %s", [SQUASH])
        db.execute("DROP VIEW pgmsg_notification_stored")  # made again if the squash ran again

    _migrate(scratch_url, "--check")  # nothing to apply
    _migrate(scratch_url)
    with psycopg.connect(scratch_url, autocommit=True) as db:
        assert to_regclass(db, "pgmsg_notification_stored") is None
        assert _rows(db, "SELECT count(*) FROM django_migrations WHERE name = %s", [SQUASH]) == [
            (1,)
        ]
