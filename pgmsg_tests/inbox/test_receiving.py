"""Declaring inboxes and receiving messages: names, options, idempotency, SQL producers."""

import psycopg
import pytest
from django.db import connection, transaction

import pgmsg
from pgmsg.core import errors, wake
from pgmsg.inbox.declarations import registry
from pgmsg.models import InboxMessage
from pgmsg_dev.devdb import database_url
from pgmsg_tests.inbox.helpers import drain, effects, status_of

pytestmark = pytest.mark.django_db(transaction=True)


# -- declaring and receiving ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "Upper", "has space", "x" * 58, "semi;colon", None])
def test_bad_inbox_names_are_refused_with_the_name_quoted(name):
    with pytest.raises(errors.InvalidName, match="inbox"):
        pgmsg.Inbox(name)


def test_an_inbox_redeclared_with_other_options_is_refused():
    with pytest.raises(errors.InboxAlreadyDeclared, match="test.inbox"):
        pgmsg.Inbox("test.inbox", ordered=True)
    assert pgmsg.Inbox(
        "test.inbox", max_attempts=3, priorities={"urgent": 0, "normal": 5}
    ) == registry.get("test.inbox")


@pytest.mark.parametrize(
    "options, complaint",
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"priorities": {"a": "high"}}, "priority of 'a'"),
        ({"priorities": {"a": 2**40}}, "priority of 'a'"),
        ({"ordered": "yes"}, "ordered"),
    ],
)
def test_bad_inbox_options_are_refused(options, complaint):
    with pytest.raises(errors.ConfigurationError, match=complaint):
        pgmsg.Inbox("test.bad-options", **options)


def test_receive_stores_once_and_reports_the_duplicate():
    first = pgmsg.receive(
        "test.inbox",
        "m-1",
        type="work",
        payload={"a": 1},
        source="webhook",
        aggregate_id=7,
        trace_id="t-1",
    )
    again = pgmsg.receive("test.inbox", "m-1", type="work", payload={"a": 2})
    assert first.stored and first.id and not first.duplicate
    assert again.duplicate and again.id is None
    row = status_of("m-1")
    assert (row.payload, row.source, row.aggregate_id, row.trace_id, row.status) == (
        {"a": 1},
        "webhook",
        "7",
        "t-1",
        "pending",
    )


def test_the_same_message_id_in_two_inboxes_is_two_messages():
    assert pgmsg.receive("test.inbox", "shared", type="work", payload={}).stored
    assert pgmsg.receive("test.ordered", "shared", type="step", payload={"seq": 0}).stored


def test_receive_many_reports_each_message_and_dedups_within_the_batch():
    pgmsg.receive("test.inbox", "b-0", type="work", payload={})
    results = pgmsg.receive_many(
        "test.inbox",
        [
            {"message_id": "b-0", "type": "work", "payload": {}},
            {"message_id": "b-1", "type": "work", "payload": {"n": 1}},
            {"message_id": "b-1", "type": "work", "payload": {"n": 2}},
            {"message_id": "b-2", "type": "low", "payload": [1, 2], "aggregate_id": "x"},
        ],
    )
    assert [r.stored for r in results] == [False, True, False, True]
    assert InboxMessage.objects.get(message_id="b-1").payload == {"n": 1}


def test_receive_many_goes_through_djangos_cursor_where_it_is_watched():
    # Its arrays are bound on the server below Django's cursor (wire.rows) unless someone
    # watches that cursor: then the statement is there, with the same result.
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        results = pgmsg.receive_many(
            "test.inbox",
            [
                {"message_id": "w-1", "type": "work", "payload": {"n": 1}, "aggregate_id": "a"},
                {"message_id": "w-1", "type": "work", "payload": {"n": 2}},
                {"message_id": "w-2", "type": "work", "payload": [], "trace_id": "t"},
            ],
        )
    assert [r.stored for r in results] == [True, False, True]
    assert any("pgmsg_receive_many" in q["sql"] for q in queries.captured_queries)
    assert InboxMessage.objects.get(message_id="w-2").trace_id == "t"


def test_a_rolled_back_receive_stores_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        pgmsg.receive("test.inbox", "rolled-back", type="work", payload={})
        raise RuntimeError("abort")
    assert not InboxMessage.objects.filter(message_id="rolled-back").exists()


@pytest.mark.parametrize(
    "kwargs, complaint",
    [
        ({"message_id": ""}, "message_id must be a non-empty string"),
        ({"type": None}, "type must be a non-empty string"),
        ({"payload": {"x": object()}}, "not JSON-serialisable"),
        ({"payload": float("nan")}, "not JSON-serialisable"),
        ({"aggregate_id": ""}, "aggregate_id"),
        ({"trace_id": 5}, "trace_id must be a string"),
    ],
)
def test_bad_messages_get_precise_errors(kwargs, complaint):
    args = {"message_id": "m", "type": "work", "payload": {}, **kwargs}
    with pytest.raises(errors.InvalidMessage, match=complaint):
        pgmsg.receive("test.inbox", **args)


def test_receiving_into_an_undeclared_inbox_is_refused_with_the_known_names():
    with pytest.raises(errors.UnknownInbox, match=r"'test.nope'.*test.inbox"):
        pgmsg.receive("test.nope", "m", type="work", payload={})


def test_sql_producers_insert_with_on_conflict_and_the_trigger_notifies():
    listener = psycopg.connect(database_url(connection.settings_dict), autocommit=True)
    try:
        listener.execute("LISTEN pgmsg")
        # The trigger NOTIFYs only while a worker for the inbox is idle (core/wake.py).
        wake.IdleDeclaration(["inbox:test.inbox"]).declare(listener.cursor())
        with connection.cursor() as cursor:
            sql = (
                "INSERT INTO pgmsg_inbox_message (inbox, message_id, type, payload) "
                "VALUES (%s, %s, %s, %s::jsonb) ON CONFLICT DO NOTHING"
            )
            cursor.execute(sql, ["test.inbox", "sql-1", "work", '{"from": "sql"}'])
            cursor.execute(sql, ["test.inbox", "sql-1", "work", '{"from": "again"}'])
            assert cursor.rowcount == 0
        got = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
        assert got == ["inbox:test.inbox"]
        # An all-duplicate insert wakes nobody.
        with connection.cursor() as cursor:
            cursor.execute(sql, ["test.inbox", "sql-1", "work", "{}"])
        assert [n.payload for n in listener.notifies(timeout=0.3)] == []
    finally:
        listener.close()
    drain()
    assert effects() == {"sql-1": 1}
    assert status_of("sql-1").processed_at is not None


def test_a_batch_gets_row_ids_in_its_own_order():
    """An ordered inbox handles an aggregate's messages in row id order: the batch's order,
    not that of the message ids (nor of the locks the rows are inserted in)."""
    batch = [f"step-{n}" for n in (3, 1, 4, 10, 5, 9, 2, 6)]
    received = pgmsg.receive_many(
        "test.ordered",
        [{"message_id": m, "type": "step", "aggregate_id": "A", "payload": {}} for m in batch],
    )
    assert [r.message_id for r in received] == batch
    ids = [r.id for r in received]
    assert ids == sorted(ids)


def test_receive_many_wakes_an_idle_worker_once_and_an_all_duplicate_batch_wakes_nobody():
    listener = psycopg.connect(database_url(connection.settings_dict), autocommit=True)
    batch = [{"message_id": f"many-{n}", "type": "work", "payload": {}} for n in range(3)]
    try:
        listener.execute("LISTEN pgmsg")
        wake.IdleDeclaration(["inbox:test.inbox"]).declare(listener.cursor())
        assert all(r.stored for r in pgmsg.receive_many("test.inbox", batch))
        assert [n.payload for n in listener.notifies(timeout=5, stop_after=1)] == [
            "inbox:test.inbox"
        ]
        assert not any(r.stored for r in pgmsg.receive_many("test.inbox", batch))
        assert [n.payload for n in listener.notifies(timeout=0.3)] == []
    finally:
        listener.close()
    drain()
    assert effects() == {"many-0": 1, "many-1": 1, "many-2": 1}


RECEIVE = "SELECT pgmsg_receive(%s, %s, 'work', %s)"


def test_sql_producers_receive_with_pgmsg_receive_once_per_message_id():
    listener = psycopg.connect(database_url(connection.settings_dict), autocommit=True)
    try:
        listener.execute("LISTEN pgmsg")
        wake.IdleDeclaration(["inbox:test.inbox"]).declare(listener.cursor())
        with psycopg.connect(database_url(connection.settings_dict)) as producer:
            first = producer.execute(RECEIVE, ["test.inbox", "fn-1", '{"n": 1}']).fetchone()[0]
            again = producer.execute(RECEIVE, ["test.inbox", "fn-1", '{"n": 2}']).fetchone()[0]
            producer.commit()
        assert isinstance(first, int) and again is None
        # One wake-up for the transaction's two calls.
        assert [n.payload for n in listener.notifies(timeout=5, stop_after=1)] == [
            "inbox:test.inbox"
        ]
        assert [n.payload for n in listener.notifies(timeout=0.3)] == []
    finally:
        listener.close()
    assert InboxMessage.objects.get(message_id="fn-1").payload == {"n": 1}
    drain()
    assert effects() == {"fn-1": 1}


def test_pgmsg_receive_leaves_the_first_receipt_trigger_armed_for_later_inserts():
    """pgmsg_receive's INSERT skips the triggers (it checks and wakes itself); an INSERT after
    it in the same transaction still meets them."""
    insert = (
        "INSERT INTO pgmsg_inbox_message (inbox, message_id, type, payload) "
        "VALUES ('test.inbox', %s, 'work', '{}') RETURNING id"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(RECEIVE, ["test.inbox", "fn-2", "{}"])
        assert cursor.fetchone()[0] is not None
        cursor.execute(insert, ["fn-2"])
        assert cursor.fetchall() == []  # the first-receipt trigger skipped the copy
        cursor.execute(insert, ["fn-3"])
        assert len(cursor.fetchall()) == 1
    assert sorted(InboxMessage.objects.values_list("message_id", flat=True)) == ["fn-2", "fn-3"]


def test_the_barrier_waits_for_a_transaction_that_called_pgmsg_receive():
    with (
        psycopg.connect(database_url(connection.settings_dict)) as producer,
        psycopg.connect(database_url(connection.settings_dict), autocommit=True) as worker,
    ):
        producer.execute(RECEIVE, ["test.inbox", "fn-4", "{}"])
        idle = wake.IdleDeclaration(["inbox:test.inbox"])
        assert idle.declare(worker.cursor()) is False, "must not sleep: a receipt is in flight"
        producer.commit()
        assert idle.declare(worker.cursor()) is True
