"""Every named SQL statement is used by the code, and PostgreSQL accepts it (EXPLAIN)."""

from __future__ import annotations

import ast
import re
from importlib import resources
from pathlib import Path

import pytest
from django.db import ProgrammingError, connection, transaction
from psycopg import sql as pgsql

import pgmsg
from pgmsg.core import sql
from pgmsg.events import subscriptions
from pgmsg.inbox import model_inbox
from pgmsg_tests.testapp.inbox_handlers import webhooks

PACKAGE = Path(pgmsg.__file__).parent
#: The files of named statements: not the migrations' frozen SQL, nor functions.sql, the
#: current text of the SQL functions (test_schema_sql.py checks those).
SQL_FILES = sorted(
    p for p in PACKAGE.rglob("*.sql") if "migrations" not in p.parts and p.name != "functions.sql"
)
#: Statements reached by a computed name: (file, name) -> where.
COMPUTED = {}
#: model_inbox.sql's fragments are parts of other statements, not statements.
FRAGMENTS = {
    "unprocessed_null",
    "unprocessed_false",
    "unprocessed_false_or_null",
    "mark_now",
    "mark_true",
    "partition_by_key",
    "partition_by_aggregate",
}
#: Utility statements (DDL, LOCK, SET, TRUNCATE) and statements on a temporary table, which
#: EXPLAIN cannot take: the partition and retention tests run them for real.
NOT_EXPLAINABLE = {
    ("partitions.sql", "create_partition"),
    ("subscriptions.sql", "analyze_events"),
    ("notifications.sql", "analyze"),
    ("partitions.sql", "drop_partition"),
    ("partitions.sql", "lock_timeout"),
    ("subscriptions.sql", "commit_without_flush"),
    ("partitions.sql", "lock_for_seal"),
    ("partitions.sql", "seal"),
    ("retention.sql", "lock_partition"),
    ("archive.sql", "lock_partition"),
    ("retention.sql", "keep_rows"),
    ("retention.sql", "empty_partition"),
    ("retention.sql", "restore_kept"),
    ("logical.sql", "create_publication"),
    # A trigger function's PL/pgSQL body (NEW, OLD, RETURN): the trigger channel tests install
    # it through the test app's migrations and fire it.
    ("triggers.sql", "row_change"),
    ("weeks.sql", "lock_table"),
}
#: subscriptions.sql's format templates of DDL, filled in for a subscription by these.
SUBSCRIPTION_DDL = {
    ("subscriptions.sql", "create_partition_index"): lambda s: subscriptions.partition_index(s)[1],
    ("subscriptions.sql", "partition_read_events"): subscriptions.partition_read,
}
#: Statements that need a newer server than the oldest one pgmsg runs on (the code checks the
#: server before it uses them): (file, name) -> (server_version_num, the function that's new).
NEEDS_NEWER_SERVER = {
    ("logical.sql", "advance_and_log_snapshot"): (160000, "pg_log_standby_snapshot"),
}
#: Statements about one partition: checked on the default partition of their table.
PARTITION_IDENTIFIERS = {
    "retention.sql": {"partition": "pgmsg_inbox_message_default"},
    "archive.sql": {"partition": "pgmsg_event_default"},
    "weeks.sql": {"partition": "pgmsg_outbox_message_default"},
    "partitions.sql": {"partition": "pgmsg_event_default"},  # events/partitions.sql's seal_bound
}
_PARAM = re.compile(r"%\((\w+)\)[sb]")
#: The export's statements name the exported table's columns: check them on the event table.
EXPORT_IDENTIFIERS = {
    "table": "pgmsg_event",
    "key": "position",
    "transaction": "transaction_id",
    "columns": "*",
    "timestamp": "recorded_at",
}
_COPY = re.compile(r"^COPY \((.*)\)\s*TO STDOUT.*$", re.DOTALL)


def statements():
    for path in SQL_FILES:
        package = ".".join(path.parent.relative_to(PACKAGE.parent).parts)
        for name, text in sql.load(package, path.name).items():
            yield pytest.param(path, name, text, id=f"{path.name}:{name}")


def python_sources() -> str:
    return "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))


def test_every_sql_file_is_found():
    assert {p.name for p in SQL_FILES} >= {
        "notifications.sql",
        "events.sql",
        "subscriptions.sql",
        "aggregates.sql",
        "inbox.sql",
        "model_inbox.sql",
        "outbox.sql",
        "partitions.sql",
        "retention.sql",
        "archive.sql",
        "triggers.sql",
        "weeks.sql",
    }


@pytest.mark.parametrize(("path", "name", "text"), list(statements()))
def test_every_named_statement_is_used(path, name, text):
    if (path.name, name) in COMPUTED or name in FRAGMENTS:
        return
    used = f'"{name}"' in python_sources()
    assert used, f"{path.name}: statement {name!r} is used nowhere in pgmsg/"


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "name", "text"), list(statements()))
def test_postgresql_accepts_every_named_statement(path, name, text):
    if name in FRAGMENTS or (path.name, name) in NOT_EXPLAINABLE:
        return
    if (path.name, name) in SUBSCRIPTION_DDL:
        # DDL cannot be EXPLAINed: run it for sample subscriptions, and roll it back.
        for sub in (
            pgmsg.Subscription("test-sql-index", category="sql", partitions=3),
            pgmsg.Subscription("test-sql-index-all", partitions=2, partition_by="data.n"),
        ):
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(SUBSCRIPTION_DDL[path.name, name](sub))
                transaction.set_rollback(True)
        return
    if path.name in PARTITION_IDENTIFIERS:
        statement = text.format(**PARTITION_IDENTIFIERS[path.name])
    elif path.name == "model_inbox.sql":
        statement = model_inbox.queries(webhooks)[name]
        if isinstance(statement, pgsql.Composed):
            statement = statement.as_string(connection.connection)
    elif (path.name, name) == ("subscriptions.sql", "read_partition"):
        statement = text.format(function="pgmsg_read_partition")
    elif path.parent.name == "export":
        statement = text.format(**EXPORT_IDENTIFIERS)
        statement = _COPY.sub(r"\1", statement)  # EXPLAIN the query a COPY reads
    else:
        statement = text
    # Parameters become NULLs of unknown type: EXPLAIN still parses, resolves every table,
    # column, function and type, and plans the statement, without running it.
    explained = _PARAM.sub("NULL", statement)
    newer = NEEDS_NEWER_SERVER.get((path.name, name))
    if newer and connection.pg_version < newer[0]:
        # An older server refuses it for the new function alone, nothing else.
        with pytest.raises(ProgrammingError, match=rf"function {newer[1]}\(\) does not exist"):
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"EXPLAIN {explained}")
        return
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {explained}")
        assert cursor.fetchall()


def test_the_loader_reads_named_blocks_and_drops_their_comments():
    text = resources.files("pgmsg.channels").joinpath("notifications.sql").read_text()
    queries = sql.load("pgmsg.channels", "notifications.sql")
    assert set(queries) == set(re.findall(r"^-- name: (\w+)", text, re.MULTILINE))
    assert all(not line.startswith("--") for q in queries.values() for line in q.splitlines())


_INLINE = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER|DROP|LOCK|TRUNCATE)\s")


def inline_statements(source: str, name: str) -> list[str]:
    """String constants that start like a SQL statement (docstrings aside)."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        f"{name}:{node.lineno}: {node.value[:60]!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and _INLINE.match(node.value)
    ]


def test_no_statement_is_written_inline_in_python():
    # Every statement lives in a .sql file beside its code. pgmsg/models is apart: the bodies
    # of its pgtrigger triggers are part of the models' declarations, which the migrations
    # copy.
    found = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if not {"migrations", "models"} & set(path.relative_to(PACKAGE).parts)
        for hit in inline_statements(path.read_text(), str(path.relative_to(PACKAGE)))
    ]
    assert not found, "SQL written in Python, not in a .sql file:\n" + "\n".join(found)


def test_the_inline_check_sees_a_statement():
    source = '"""SELECT in a docstring is prose."""\ncursor.execute("SELECT 1")\n'
    assert inline_statements(source, "m.py") == ["m.py:2: 'SELECT 1'"]


def test_numbered_gives_libpq_placeholders_in_the_order_named():
    query = "SELECT f(%(b)s, %(a)b, %(b)s, %(ab)s)"
    assert sql.numbered(query, ["a", "b", "ab"]) == b"SELECT f($2, $1, $2, $3)"
    with pytest.raises(ValueError, match="no %\\(c\\)s"):
        sql.numbered(query, ["c"])
