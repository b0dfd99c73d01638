"""The migrated database holds the current text of every SQL function and trigger.

The functions' text lives in pgmsg/*/functions.sql; migrations apply frozen copies
(pgmsg/migrations/README.md). The triggers' text lives in the models' pgtrigger declarations.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pgtrigger
import pytest
from django.db import connection, transaction

import pgmsg
from pgmsg_dev import freeze_sql

pytestmark = pytest.mark.django_db

#: Where the files' functions are created to be compared with the database's.
SCRATCH = "pgmsg_current_sql"

#: Every function named pgmsg_* in a schema: its name, identity arguments and definition, the
#: schema's name left out. pgmsg_read_part_* are made at run time by subscriptions of more
#: than one partition (events/subscriptions.py, partition_read), from pgmsg_read_partition.
DEFINITIONS = """
SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
       replace(pg_get_functiondef(p.oid), quote_ident(n.nspname) || '.', '')
FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
WHERE n.nspname = %s AND p.proname LIKE 'pgmsg\\_%%'
  AND p.proname NOT LIKE 'pgmsg\\_read\\_part\\_%%'
"""


def definitions(schema: str) -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(DEFINITIONS, [schema])
        return dict(cursor.fetchall())


def file_definitions() -> dict[str, str]:
    """The definitions PostgreSQL makes of the files' text, created in a scratch schema (in a
    transaction rolled back): the same normal form as the database's."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE SCHEMA {SCRATCH}")
            cursor.execute(f"SET LOCAL search_path = {SCRATCH}")
            for name, (path, text) in freeze_sql.current_functions().items():
                cursor.execute(text)
                cursor.execute("SELECT count(*) FROM pg_proc WHERE proname = %s AND "
                               "pronamespace = %s::regnamespace", [name, SCRATCH])  # fmt: skip
                assert cursor.fetchone() == (1,), f"{path}: the block of {name} creates {name}"
            cursor.execute("RESET search_path")
        found = definitions(SCRATCH)
        transaction.set_rollback(True)
    return found


def installed_schema() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        return cursor.fetchone()[0]


def test_every_function_file_is_found():
    assert {p.parent.name for p in freeze_sql.function_files()} >= {
        "core",
        "channels",
        "events",
        "inbox",
    }
    assert "pgmsg_send" in freeze_sql.current_functions()


def test_the_database_holds_the_current_text_of_every_function():
    installed = definitions(installed_schema())
    current = file_definitions()
    assert sorted(installed) == sorted(current), (
        "functions of the database without a block in pgmsg/*/functions.sql, or the reverse"
    )
    differ = [name for name in current if installed[name] != current[name]]
    assert not differ, (
        f"the database's text of {differ} is not that of pgmsg/*/functions.sql: freeze the "
        "file's text into a migration (pgmsg/migrations/README.md), or bring a migration's "
        "change into the file"
    )


def test_the_comparison_sees_a_changed_body():
    # A file's text one space different from the database's is told apart.
    installed = definitions(installed_schema())
    path, text = freeze_sql.current_functions()["pgmsg_wake_busy"]
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE SCHEMA {SCRATCH}")
            cursor.execute(f"SET LOCAL search_path = {SCRATCH}")
            cursor.execute(text.replace("BEGIN", "BEGIN ", 1))
            cursor.execute("RESET search_path")
        changed = definitions(SCRATCH)
        transaction.set_rollback(True)
    assert (
        changed["pgmsg_wake_busy(payloads text[])"] != installed["pgmsg_wake_busy(payloads text[])"]
    )


def test_every_trigger_of_the_models_is_installed_as_declared():
    # pgtrigger compares each installed trigger's hash with its model's declaration.
    status = {
        f"{model._meta.label}:{trigger.name}": trigger.get_installation_status(model)[0]
        for model, trigger in pgtrigger.registered()
        if model._meta.app_label == "pgmsg"
    }
    assert status and set(status.values()) == {"INSTALLED"}, status
    # And no trigger on pgmsg's tables that no model declares.
    assert not [t for t in pgtrigger.prunable() if t[0].startswith("pgmsg_")]


def test_migrations_import_nothing_from_pgmsg_nor_from_each_other():
    # A migration's text must not change with pgmsg's code: it reads its frozen SQL by path.
    found = []
    for path in sorted((Path(pgmsg.__file__).parent / "migrations").glob("[0-9]*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or "." * node.level]
            found += [
                f"{path.name}: {n}" for n in names if n.split(".")[0] in ("pgmsg", "importlib", "")
            ]
    assert not found, found
