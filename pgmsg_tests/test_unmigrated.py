"""A database where ``migrate`` never ran: ``check`` says so, ``listen`` stops at once, and the
producers raise NotMigrated naming the fix (issue 44, item 5).

Each test points processes at a fresh empty database on the test server (DATABASE_URL).
"""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest
from django.db import connection

from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import ROOT

pytestmark = [pytest.mark.django_db, pytest.mark.processes]


@pytest.fixture
def empty_env():
    """The environment of a process whose default database is a new, empty one."""
    name = f"pgmsg_unmigrated_{os.getpid()}"
    admin_url = database_url(connection.settings_dict, name="postgres")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url(connection.settings_dict, name=name)
    env["DJANGO_SETTINGS_MODULE"] = "pgmsg_tests.settings"
    yield env
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def django(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_names_the_unapplied_migrations_and_migrate_still_runs(empty_env):
    done = django(empty_env, "check")
    assert done.returncode == 1, done.stderr
    assert "pgmsg.E010" in done.stderr and "0001_squashed_0030" in done.stderr, done.stderr
    assert "manage.py migrate" in done.stderr
    # check --database asks about that database only; another one is not this check's.
    assert "pgmsg.E010" in django(empty_env, "check", "--database", "default").stderr
    assert "pgmsg.E010" not in django(empty_env, "check", "--database", "logical").stderr
    # The migration commands run on such a database: the quick start's makemigrations
    # comes before its migrate.
    for command in (["makemigrations", "--check", "--dry-run"], ["showmigrations", "pgmsg"]):
        done = django(empty_env, *command)
        assert done.returncode == 0 and "pgmsg.E010" not in done.stderr, (command, done.stderr)
    # migrate's own checks must not refuse to apply what they report.
    done = django(empty_env, "migrate", "pgmsg", "0001_squashed_0030", "-v", "0")
    assert done.returncode == 0, done.stderr
    done = django(empty_env, "check")
    assert (
        done.returncode == 1
        and "0031_overview_view_only" in done.stderr
        and "0001_" not in done.stderr
    )


@pytest.mark.parametrize("skip_checks", [False, True])
def test_listen_exits_at_once_saying_to_migrate(empty_env, skip_checks):
    done = django(empty_env, "listen", "--until-idle", *(["--skip-checks"] if skip_checks else []))
    assert done.returncode != 0
    assert "manage.py migrate" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


PRODUCERS = """
import django, uuid
django.setup()
import pgmsg
from decimal import Decimal
from pgmsg_tests.testapp.channels import Work
from pgmsg_tests.testapp.events_handlers import Deposited
from pgmsg_tests.testapp.outbox_declarations import recorded

calls = {
    "notify": lambda: pgmsg.notify(Work(key="k")),
    "notify_many": lambda: pgmsg.notify_many([Work(key="k")]),
    "receive": lambda: pgmsg.receive("test.inbox", "m1", type="t", payload={}),
    "receive_many": lambda: pgmsg.receive_many(
        "test.inbox", [{"message_id": "m2", "type": "t", "payload": {}}]
    ),
    "publish": lambda: pgmsg.publish(recorded, {"a": 1}, type="t"),
    "append": lambda: pgmsg.append(f"account-{uuid.uuid4()}", Deposited(amount=Decimal(1))),
}
for name, call in calls.items():
    try:
        call()
    except pgmsg.errors.NotMigrated as exc:
        print(name, "NotMigrated", exc)
    except Exception as exc:
        print(name, type(exc).__name__, exc)
"""


def test_producers_raise_not_migrated_naming_the_fix(empty_env):
    done = subprocess.run(
        [sys.executable, "-c", PRODUCERS],
        cwd=ROOT,
        env=empty_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stdout.splitlines()
    assert [line.split(" ", 2)[:2] for line in lines] == [
        [name, "NotMigrated"]
        for name in ("notify", "notify_many", "receive", "receive_many", "publish", "append")
    ], done.stdout + done.stderr
    for line in lines:
        assert "manage.py migrate" in line and "'default'" in line, line


def test_the_demo_runs_on_a_database_it_has_not_migrated_yet(empty_env):
    # `make demo` on a fresh machine: the demo migrates first, so pgmsg.E010 must not stop it.
    env = {**empty_env, "DJANGO_SETTINGS_MODULE": "example_project.settings"}
    done = subprocess.run(
        [sys.executable, "manage.py", "demo"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every order shipped and invoiced exactly once" in done.stdout
