"""Statements below psycopg's cursor (core/wire/batches.py, protocol.py): the first statement
of an atomic block carries its BEGIN in the same query string, and behaves as the cursor's
execute would."""

from __future__ import annotations

import contextlib
import json
import tempfile

import psycopg
import pytest
from django.db import ProgrammingError, connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from psycopg.pq import TransactionStatus

from pgmsg.core import wire
from pgmsg.core.wire import protocol

pytestmark = pytest.mark.django_db(transaction=True)

INSERT = "INSERT INTO libpq_probe (value) VALUES (%(value)s) RETURNING id, value"


@pytest.fixture(autouse=True)
def probe_table():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE libpq_probe (id serial PRIMARY KEY, value text NOT NULL)")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE libpq_probe")


@contextlib.contextmanager
def sent():
    """The messages the client sends on Django's connection meanwhile, as (type, contents)
    from libpq's protocol trace: a simple-protocol query string is one "Query" message."""
    messages: list[tuple[str, str]] = []
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        try:
            yield messages
        finally:
            pgconn.untrace()
            trace.seek(0)
            client = False
            for line in trace:  # timestamp, F (client) or B (server), length, type, contents
                fields = line.rstrip("\n").split("\t")
                if len(fields) >= 4 and fields[1] in ("F", "B"):
                    client = fields[1] == "F"
                    if client:
                        messages.append((fields[3], "\t".join(fields[4:])))
                elif client:  # a query string's next line
                    kind, contents = messages[-1]
                    messages[-1] = (kind, contents + "\n" + line.rstrip("\n"))


def values() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT value FROM libpq_probe ORDER BY id")
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.wire_fast_path
def test_the_first_statement_of_an_atomic_block_carries_its_begin_in_one_query_string():
    connection.ensure_connection()
    with sent() as messages, transaction.atomic():
        (rows,) = wire.opening_rows(connection, INSERT, {"value": "it's"})
        assert connection.connection.pgconn.transaction_status == TransactionStatus.INTRANS
    assert [kind for kind, _ in messages] == ["Query", "Query"]  # the read, then COMMIT
    assert messages[0][1].startswith(' "BEGIN;')
    assert "'it''s'" in messages[0][1]  # bound on the client, quoted as Django's cursor does
    assert messages[1][1] == ' "COMMIT"'
    assert [value for _, value in rows] == ["it's"]
    assert values() == ["it's"]


def test_what_it_wrote_rolls_back_with_the_block():
    with transaction.atomic():
        wire.opening_rows(connection, INSERT, {"value": "gone"})
        transaction.set_rollback(True)
    assert values() == []


def test_later_statements_of_the_block_go_through_the_cursor_in_the_same_transaction():
    with transaction.atomic():
        wire.opening_rows(connection, INSERT, {"value": "first"})
        with sent() as messages:
            (rows,) = wire.opening_rows(connection, INSERT, {"value": "second"})
        transaction.set_rollback(True)
    assert [kind for kind, _ in messages] == ["Query"]
    assert "BEGIN" not in messages[0][1]
    assert [value for _, value in rows] == ["second"]
    assert values() == []  # both were in the block's transaction


def test_each_statement_of_the_string_gives_its_rows():
    with transaction.atomic():
        first, second = wire.opening_rows(
            connection,
            "SELECT %(a)s::int; SELECT x FROM generate_series(1, %(n)s) AS x",
            {"a": 7, "n": 3},
        )
    assert first == [(7,)]
    assert second == [(1,), (2,), (3,)]


def test_a_failing_statement_raises_djangos_error_rolls_the_block_back_and_leaves_it_usable():
    with pytest.raises(ProgrammingError, match="no_such_table"):
        with transaction.atomic():
            wire.opening_rows(connection, "SELECT * FROM no_such_table", {})
    assert connection.connection.pgconn.transaction_status == TransactionStatus.IDLE
    with transaction.atomic():
        wire.opening_rows(connection, INSERT, {"value": "after"})
    assert values() == ["after"]


def test_logged_queries_go_through_djangos_cursor_and_are_seen():
    with CaptureQueriesContext(connection) as captured:
        with transaction.atomic():
            (rows,) = wire.opening_rows(connection, INSERT, {"value": "logged"})
    assert [value for _, value in rows] == ["logged"]
    assert any("INSERT INTO libpq_probe" in query["sql"] for query in captured.captured_queries)


def test_an_isolation_level_of_psycopgs_own_keeps_psycopgs_begin():
    connection.ensure_connection()
    conn = connection.connection
    conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE  # psycopg's BEGIN says so
    try:
        with transaction.atomic(), connection.cursor() as cursor, sent() as messages:
            wire.opening_rows(connection, INSERT, {"value": "serializable"})
            cursor.execute("SHOW transaction_isolation")
            assert cursor.fetchone()[0] == "serializable"
    finally:
        conn.isolation_level = None
    assert messages[0] == ("Query", ' "BEGIN ISOLATION LEVEL SERIALIZABLE"')
    assert values() == ["serializable"]


def test_a_lazy_cursor_is_djangos_made_on_first_use_in_the_same_transaction_and_closed_after():
    with transaction.atomic(), wire.LazyCursor(connection) as unused:
        wire.opening_rows(connection, INSERT, {"value": "no cursor"})
    assert unused._cursor is None  # a batch that needed none made none
    with transaction.atomic(), wire.LazyCursor(connection) as cursor:
        wire.opening_rows(connection, INSERT, {"value": "first"})
        with CaptureQueriesContext(connection) as captured:
            cursor.execute("INSERT INTO libpq_probe (value) VALUES (%s)", ["second"])
        assert "INSERT INTO libpq_probe" in captured.captured_queries[0]["sql"]  # Django's
        made = cursor._cursor
        transaction.set_rollback(True)
    assert made.closed
    assert values() == ["no cursor"]  # the second block's rows rolled back together


# -- the block's last statements and its COMMIT in one query string (closing_commit) ---------

UPDATE = "UPDATE libpq_probe SET value = %(value)s WHERE value = %(was)s"


@pytest.mark.wire_fast_path
def test_the_last_statements_and_the_commit_go_in_one_query_string_and_hooks_still_run():
    ran = []
    with sent() as messages, transaction.atomic():
        wire.opening_rows(connection, INSERT, {"value": "it's"})
        transaction.on_commit(lambda: ran.append(connection.connection.pgconn.transaction_status))
        wire.closing_commit(
            connection, [(UPDATE, {"value": "done", "was": "it's"}), ("SELECT 1", {})]
        )
        assert connection.connection.pgconn.transaction_status == TransactionStatus.IDLE
    # The block's exit sent nothing: the COMMIT had gone with the statements.
    assert [kind for kind, _ in messages] == ["Query", "Query"]
    assert messages[1][1].startswith(" \"UPDATE libpq_probe SET value = 'done'")
    assert messages[1][1].endswith('SELECT 1;\nCOMMIT"')
    assert ran == [TransactionStatus.IDLE]  # on_commit ran, after the commit, as usual
    assert values() == ["done"]


def test_a_failing_closing_statement_commits_nothing_and_raises_djangos_error():
    with pytest.raises(ProgrammingError, match="no_such_table"):
        with transaction.atomic():
            wire.opening_rows(connection, INSERT, {"value": "kept?"})
            wire.closing_commit(connection, [("UPDATE no_such_table SET x = 1", {})])
    assert connection.connection.pgconn.transaction_status == TransactionStatus.IDLE
    assert values() == []


def test_inside_a_callers_transaction_it_runs_the_statements_and_leaves_the_commit_to_it():
    with transaction.atomic():
        wire.opening_rows(connection, INSERT, {"value": "outer"})
        with transaction.atomic():
            wire.closing_commit(connection, [(UPDATE, {"value": "inner", "was": "outer"})])
            assert connection.connection.pgconn.transaction_status == TransactionStatus.INTRANS
        assert values() == ["inner"]
        transaction.set_rollback(True)  # the caller's decision holds for what it ran
    assert values() == []


def test_watched_it_runs_the_statements_through_djangos_cursor_and_the_block_commits():
    with CaptureQueriesContext(connection) as captured:
        with transaction.atomic():
            wire.opening_rows(connection, INSERT, {"value": "logged"})
            wire.closing_commit(connection, [(UPDATE, {"value": "seen", "was": "logged"})])
    assert any("UPDATE libpq_probe" in query["sql"] for query in captured.captured_queries)
    assert values() == ["seen"]


# -- statements bound once, their varying integers written in (opening_rows' varying) --------

PICK = (
    "SELECT x FROM unnest(%(names)s::text[]) WITH ORDINALITY AS t(name, x)"
    " WHERE x >= %(low)s AND x<%(high)s AND name <> %(skip)s ORDER BY x"
)


def bound_text(params: dict, varying=("low", "high")) -> str:
    """The query string opening_rows sends for PICK with ``params`` and ``varying``."""
    with transaction.atomic(), sent() as messages:
        (rows,) = wire.opening_rows(connection, PICK, params, varying=varying)
    assert messages[0][1].startswith(' "BEGIN;')
    bound = messages[0][1]
    with connection.cursor() as cursor:  # what the cursor binds in full: the same rows
        cursor.execute(PICK, params)
        assert rows == cursor.fetchall()
    return bound


@pytest.mark.wire_fast_path
def test_a_statement_bound_once_sends_what_binding_it_each_time_sends():
    names = ["a", "b", "it's", "d", "e"]
    for low, high in [(1, 9), (2, 4), (0, 0), (-3, 2), (5, -1), (3, 5)]:
        params = {"names": names, "low": low, "high": high, "skip": "b"}
        with connection.cursor() as cursor:
            expected = cursor.cursor.mogrify(PICK, params)
        text = bound_text(params)
        assert text == f' "BEGIN;\n{expected}"'
    # Negative integers keep psycopg's space: "x<-1" would read as the operator "<-".
    assert "x< -1" in bound_text({"names": names, "low": 5, "high": -1, "skip": "b"})


@pytest.mark.wire_fast_path
def test_other_values_of_the_fixed_parameters_are_bound_anew():
    first = bound_text({"names": ["a", "b"], "low": 1, "high": 3, "skip": "a"})
    second = bound_text({"names": ["a", "c"], "low": 1, "high": 3, "skip": "c"})
    assert "'{a,b}'" in first and "'a'" in first
    assert "'{a,c}'" in second and "'c'" in second


@pytest.mark.wire_fast_path
def test_a_varying_value_that_is_not_an_integer_is_bound_as_it_is():
    text = bound_text({"names": ["a", "b", "c"], "low": "2", "high": 2.5, "skip": ""})
    assert "x >= '2' AND x<2.5" in text


@pytest.mark.wire_fast_path
def test_a_varying_value_that_is_none_is_bound_as_null_apart_from_the_integers():
    names = ["a", "b", "c"]
    with_null = {"names": names, "low": None, "high": 3, "skip": ""}
    with connection.cursor() as cursor:
        expected = cursor.cursor.mogrify(PICK, with_null)
    assert bound_text(with_null) == f' "BEGIN;\n{expected}"'  # no rows: x >= NULL
    kept = connection.__dict__["_pgmsg_bound"][1]
    assert any(("low", type(None), None) in key for key in kept)  # kept, the NULL in its key
    # The statement bound with the NULL does not stand in for the one with an integer there,
    # nor the other way round, in either order.
    assert "x >= 2 AND x<3" in bound_text({**with_null, "low": 2})
    assert "x >= NULL AND x<3" in bound_text(with_null)
    assert "x >= 1 AND x<3" in bound_text({**with_null, "low": 1})


@pytest.mark.wire_fast_path
def test_statements_bound_once_are_forgotten_with_their_connection():
    bound_text({"names": ["a"], "low": 1, "high": 2, "skip": ""})
    kept = connection.__dict__["_pgmsg_bound"]
    assert kept[0] is connection.connection and kept[1]
    connection.close()
    assert "x >= 1 AND x<2" in bound_text({"names": ["a"], "low": 1, "high": 2, "skip": ""})
    assert connection.__dict__["_pgmsg_bound"][0] is connection.connection is not kept[0]


# -- prepared (opening_rows' prepare): BEGIN and the prepared statement in one round trip ----


def prepared_pick(params: dict) -> tuple[list[tuple], list[tuple[str, str]]]:
    """PICK's rows through opening_rows with prepare, and the messages it sent."""
    with sent() as messages, transaction.atomic():
        (rows,) = wire.opening_rows(connection, PICK, params, varying=("low", "high"), prepare=True)
        assert connection.connection.pgconn.transaction_status == TransactionStatus.INTRANS
    return rows, messages


def server_prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE name LIKE 'pgmsg_%%'")
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.wire_fast_path
def test_a_prepared_opening_statement_gives_the_rows_binding_it_gives_and_is_parsed_once():
    names = ["a", "b", "it's", "d", "e"]
    for round_, (low, high) in enumerate([(1, 9), (2, 4), (0, 0), (-3, 2), (3, 5)]):
        params = {"names": names, "low": low, "high": high, "skip": "b"}
        rows, messages = prepared_pick(params)
        with connection.cursor() as cursor:
            cursor.execute(PICK, params)
            assert rows == cursor.fetchall()
        kinds = [kind for kind, _ in messages]
        # BEGIN (unnamed: Parse, Bind, Execute), the statement by name (Bind, Execute), one
        # Sync: one round trip; then the block's COMMIT. Parse of the statement the first time.
        opening = ["Parse", "Bind", "Describe", "Execute", "Bind", "Describe", "Execute", "Sync"]
        assert kinds[-len(opening) - 1 :] == [*opening, "Query"]
        assert ("Parse" in kinds[: -len(opening) - 1]) == (round_ == 0)
    (statement,) = server_prepared()
    assert "x >= $1 AND x<$2" in statement and "it''s" in statement


def test_what_a_prepared_opening_statement_wrote_rolls_back_with_the_block():
    insert = "INSERT INTO libpq_probe (value) VALUES (%(value)s || %(n)s) RETURNING value"
    with transaction.atomic():
        (rows,) = wire.opening_rows(
            connection, insert, {"value": "x", "n": 1}, varying=("n",), prepare=True
        )
        transaction.set_rollback(True)
    assert rows == [("x1",)] and values() == []


@pytest.mark.wire_fast_path
def test_a_prepared_statement_deallocated_behind_its_back_is_prepared_anew_in_the_same_call():
    params = {"names": ["a", "b", "c"], "low": 1, "high": 3, "skip": ""}
    prepared_pick(params)
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # a handler's, say
    with sent() as messages, transaction.atomic():
        wire.opening_rows(connection, INSERT, {"value": "before"})  # not prepared
    rows, messages = prepared_pick(params)  # fails, rolls back its BEGIN, prepares, runs
    assert rows == [(1,), (2,)]
    kinds = [kind for kind, _ in messages]
    assert kinds.count("Sync") == 3 and kinds.count("Query") == 2  # the ROLLBACK, the COMMIT
    assert len(server_prepared()) == 1
    assert values() == ["before"]


@pytest.mark.wire_fast_path
def test_a_varying_value_that_is_neither_an_integer_nor_none_is_bound_in_full_not_prepared():
    params = {"names": ["a", "b", "c"], "low": 1.5, "high": 3, "skip": ""}
    rows, messages = prepared_pick(params)
    assert rows == [(2,)] and messages[0][0] == "Query"
    assert messages[0][1].startswith(' "BEGIN;')
    assert server_prepared() == []


@pytest.mark.wire_fast_path
def test_a_varying_none_is_a_null_parameter_of_the_same_prepared_statement():
    with connection.cursor() as cursor:
        cursor.execute(PICK, {"names": ["a", "b", "c"], "low": None, "high": 3, "skip": ""})
        expected = cursor.fetchall()
    for low in (None, 1, None):
        params = {"names": ["a", "b", "c"], "low": low, "high": 3, "skip": ""}
        rows, messages = prepared_pick(params)
        assert rows == (expected if low is None else [(1,), (2,)])
        assert [kind for kind, _ in messages][-2:] == ["Sync", "Query"]  # by name, then COMMIT
    (statement,) = server_prepared()
    assert "x >= $1 AND x<$2" in statement


# -- wire.int8_array, read back by the server (text_array and uuid_array: events) ---------


@pytest.mark.parametrize(
    "items",
    [[], [0], [1, -1, 2**63 - 1, -(2**63)], list(range(-500, 500))],
    ids=["empty", "zero", "extremes", "a thousand"],
)
def test_an_int8_array_is_what_the_server_reads(items):
    connection.ensure_connection()
    binary = wire.int8_array(items)
    (result,) = protocol.run(
        connection.connection,
        lambda pgconn: pgconn.send_query_params(
            b"SELECT array_to_json($1::bigint[])::text", [binary], param_formats=[1]
        ),
    )
    assert json.loads(result.get_value(0, 0)) == items


def test_the_claims_dumper_sends_an_int8_array_through_psycopgs_cursor():
    from pgmsg.core import claims

    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::bigint[]", [claims._Ids([3, -4, 2**62])])
        assert cursor.fetchone()[0] == [3, -4, 2**62]


# -- sends prepared by name (PGMSG["PREPARE_STATEMENTS"]) ------------------------------------


@pytest.mark.wire_fast_path
def test_append_and_receive_are_prepared_once_per_connection_unless_told_not_to():
    import pgmsg
    from pgmsg_tests.testapp.events_handlers import Step

    def prepared() -> dict[str, str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT name, statement FROM pg_prepared_statements")
            return dict(cursor.fetchall())

    with override_settings(PGMSG={"PREPARE_STATEMENTS": False}):
        connection.close()
        pgmsg.append("prepared-0", Step(n=0))
        pgmsg.append("prepared-0", Step(n=1))  # the kept connection's shorter path
        pgmsg.receive("test.inbox", "prepared-0", type="work", payload={})
        pgmsg.receive("test.inbox", "prepared-00", type="work", payload={})
        assert prepared() == {}
    connection.close()
    for n in range(1, 4):
        pgmsg.append("prepared-1", Step(n=n))
        assert pgmsg.receive("test.inbox", f"prepared-{n}", type="work", payload={}).stored
    assert not pgmsg.receive("test.inbox", "prepared-1", type="work", payload={}).stored
    statements = prepared()
    assert sorted(statements) == sorted(n for n in statements if n.startswith("pgmsg_"))
    calls = sorted(s.split("(")[0].split()[-1] for s in statements.values())
    assert calls == ["pgmsg_append", "pgmsg_receive"], statements
    assert [e.event.n for e in pgmsg.read_stream("prepared-1")] == [1, 2, 3]
