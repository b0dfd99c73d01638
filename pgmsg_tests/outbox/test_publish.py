"""publish(): the row is written in the caller's transaction, checked, and ordered by key."""

from __future__ import annotations

import threading
import uuid
from decimal import Decimal

import pytest
from django.db import connection, transaction

import pgmsg
from pgmsg.core import errors
from pgmsg.outbox import declarations
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.helpers import refused_by_the_server
from pgmsg_tests.outbox.helpers import rows
from pgmsg_tests.testapp.outbox_declarations import OrderPlaced, recorded

pytestmark = pytest.mark.django_db


def test_a_typed_message_is_written_with_its_type_topic_key_and_headers():
    published = pgmsg.publish(
        OrderPlaced(order_id=7, total=Decimal("9.90")), key="order-7", headers={"tenant": "a"}
    )
    assert published.stored and published.id
    row = rows("test.recorded").get()
    assert (row.message_id, row.type, row.topic, row.key, row.destination) == (
        published.message_id,
        "order.placed",
        "orders",
        "order-7",
        "recorder",
    )
    assert row.payload == {"order_id": 7, "total": "9.90", "note": None}
    assert row.headers == {"tenant": "a"}
    uuid.UUID(published.message_id)  # a new UUID by default


def test_an_untyped_message_names_its_outbox_and_type():
    pgmsg.publish("test.recorded", {"a": [1, 2]}, type="thing.done", key=5)
    recorded.publish("thing.undone", {"b": 1}, topic="things")
    first, second = rows("test.recorded")
    assert (first.type, first.topic, first.key, first.payload) == (
        "thing.done",
        "thing.done",
        "5",
        {"a": [1, 2]},
    )
    assert (second.type, second.topic, second.key) == ("thing.undone", "things", None)


def test_a_pending_message_id_is_not_written_twice():
    assert pgmsg.publish("test.recorded", {}, type="t", message_id="m-1").stored
    again = pgmsg.publish("test.recorded", {"other": 1}, type="t", message_id="m-1")
    assert not again.stored and again.id is None
    assert rows("test.recorded").count() == 1


@pytest.fixture
def refused_message():
    with refused_by_the_server("pgmsg_outbox_message", "message_id", "refused-1") as message_id:
        yield message_id


@pytest.mark.parametrize("watched", [False, True])
def test_publish_goes_through_djangos_cursor_where_it_is_watched_and_its_errors_are_djangos(
    watched, refused_message
):
    """publish() goes through the wire layer's ladder (docs/wire.md): an execute wrapper sees
    its statement; watched or not, a database error is django.db's."""
    import contextlib

    import psycopg
    from django.db import DataError

    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    watching = connection.execute_wrapper(wrapper) if watched else contextlib.nullcontext()
    with watching:
        first = pgmsg.publish(OrderPlaced(order_id=1, total=Decimal(1)), message_id="ladder-1")
        again = pgmsg.publish(OrderPlaced(order_id=1, total=Decimal(1)), message_id="ladder-1")
        with pytest.raises(DataError) as raised, transaction.atomic():
            pgmsg.publish(OrderPlaced(order_id=2, total=Decimal(1)), message_id=refused_message)
    assert (first.stored, again.stored, again.id) == (True, False, None)
    assert first.id == rows("test.recorded").get(message_id="ladder-1").id
    assert any("INSERT INTO pgmsg_outbox_message" in sql for sql in seen) == watched
    assert not isinstance(raised.value, psycopg.Error)
    assert isinstance(raised.value.__cause__, psycopg.errors.DivisionByZero)


def test_publish_many_writes_in_order_and_reports_duplicates():
    results = pgmsg.publish_many(
        [
            (OrderPlaced(order_id=1, total=Decimal(1)), {"key": "k", "message_id": "a"}),
            OrderPlaced(order_id=2, total=Decimal(2)),
            (OrderPlaced(order_id=3, total=Decimal(3)), {"key": "k", "message_id": "a"}),
        ]
    )
    assert [r.stored for r in results] == [True, True, False]
    assert [r.payload["order_id"] for r in rows("test.recorded")] == [1, 2]


@pytest.mark.parametrize(
    "call, complaint",
    [
        (lambda: pgmsg.publish("test.nope", {}, type="t"), "no outbox named 'test.nope'"),
        (lambda: pgmsg.publish("test.recorded", {}), "type must be a non-empty string"),
        (lambda: pgmsg.publish("test.recorded", type="t"), "needs a payload"),
        (lambda: pgmsg.publish("test.recorded", {1j}, type="t"), "not JSON-serialisable"),
        (lambda: pgmsg.publish("test.recorded", {}, type="t", key=""), "key must be"),
        (
            lambda: pgmsg.publish("test.recorded", {}, type="t", headers={"pgmsg-type": "x"}),
            "set by pgmsg",
        ),
        (lambda: pgmsg.publish("test.recorded", {}, type="t", headers={"a": 1}), "a string"),
        (
            lambda: pgmsg.publish(OrderPlaced(order_id=1, total=Decimal(1)), type="x"),
            "carries its own payload",
        ),
        (lambda: pgmsg.publish(object()), "cannot publish"),
        (lambda: pgmsg.publish(OrderPlaced(order_id=1, total=object())), "cannot encode"),
        (
            lambda: pgmsg.publish(OrderPlaced(order_id="x", total=Decimal(1))),
            r"cannot publish 'order.placed' to 'test.recorded': OrderPlaced.order_id",
        ),
    ],
)
def test_bad_messages_are_refused_with_a_precise_error(call, complaint):
    with pytest.raises(errors.PgmsgError, match=complaint):
        call()
    assert not rows("test.recorded").exists()


def test_declarations_are_checked():
    with pytest.raises(errors.InvalidName):
        pgmsg.Outbox("Bad Name", destination="recorder")
    with pytest.raises(errors.ConfigurationError, match="partitions must be a positive int"):
        pgmsg.Outbox("test.badparts", destination="recorder", partitions=0)
    with pytest.raises(errors.OutboxAlreadyDeclared):
        pgmsg.Outbox("test.recorded", destination="rabbit")
    with pytest.raises(errors.ConfigurationError, match="cannot be carried in a payload"):

        @recorded.message("bad.type")
        class Bad:
            when: object.__class__  # a type, not a payload value

    with pytest.raises(errors.OutboxAlreadyDeclared, match="declared by"):

        @recorded.message("order.placed")
        class Again:
            order_id: int

    assert declarations.registry.get("test.recorded") is recorded


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_transaction_writes_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        pgmsg.publish("test.recorded", {}, type="t")
        raise RuntimeError("roll back")
    assert not rows("test.recorded").exists()


@pytest.mark.django_db(transaction=True)
def test_one_keys_ids_follow_commit_order():
    """A second transaction publishing to a key waits for the first to end, so its message
    gets the later id even though it started writing first."""
    from django.db import connections

    started = threading.Event()
    second_id: list[int] = []

    def second() -> None:
        started.wait(10)
        with transaction.atomic():
            second_id.append(pgmsg.publish("test.recorded", {"n": 2}, type="t", key="k").id)
        connections.close_all()

    with transaction.atomic():
        first = pgmsg.publish("test.recorded", {"n": 1}, type="t", key="k")
        thread = threading.Thread(target=second)
        thread.start()
        started.set()
        wait_for(
            lambda: _waiting_on_advisory_lock(),
            timeout=10,
            message="the second publisher waits for the key's lock",
        )
        assert thread.is_alive()
    thread.join(10)
    assert second_id and second_id[0] > first.id
    assert [r.payload["n"] for r in rows("test.recorded")] == [1, 2]


def _waiting_on_advisory_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return cursor.fetchone()[0] == 1
