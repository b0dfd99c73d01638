"""Bad or unusual input: every Django field type through a trigger channel, malformed trigger
payloads, rows of channels nobody declares, and payload values JSON cannot carry as they are."""

import datetime as dt
import json
import math
import uuid
from decimal import Decimal

import pytest
from django.db import connection
from psycopg.types.range import Range

import pgmsg
from pgmsg.core import errors, payloads
from pgmsg.core.worker import Worker
from pgmsg.models import Notification, NotificationDeadLetter
from pgmsg_tests.testapp import listeners
from pgmsg_tests.testapp.channels import Edges
from pgmsg_tests.testapp.every_field import EveryField
from pgmsg_tests.testapp.models import Effect, Order

UTC = dt.UTC

#: One case per field type: the column, and a value to store in it.
FIELD_VALUES = {
    "big": -(2**62),
    "binary": b"\x00\x01\xfe\xff pgmsg",
    "boolean": False,
    "char": "caf\u00e9 \u2603 'quoted' \"double\"",
    "date": dt.date(2026, 2, 28),
    "datetime": dt.datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=UTC),
    "decimal": Decimal("-12345678901234.123456"),
    "duration": dt.timedelta(days=3, hours=4, minutes=5, seconds=6, microseconds=789),
    "email": "someone@example.org",
    "file": "uploads/a file.txt",
    "file_path": "/tmp/x.txt",
    "float": 0.1 + 0.2,
    "ip": "2001:db8::1",
    "integer": -2147483648,
    "json": {"a": [1, 2.5, None, True], "b": {"c": "d"}, "n": 1e-7},
    "positive_big": 2**63 - 1,
    "positive": 2147483647,
    "positive_small": 32767,
    "slug": "a-slug_1",
    "small": -32768,
    "text": "line\nbreak\ttab \\ backslash",
    "time": dt.time(23, 59, 59, 999999),
    "url": "https://example.org/a?b=c&d=e",
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "array": [1, -2, None, 3],
    "nested_array": [["a", "b"], ["c", "d"]],
    "integer_range": Range(1, 10),
    "big_integer_range": Range(-(2**40), None),
    "decimal_range": Range(Decimal("1.5"), Decimal("2.25"), "[]"),
    "date_range": Range(dt.date(2026, 1, 1), dt.date(2026, 2, 1)),
    "datetime_range": Range(
        dt.datetime(2026, 1, 1, tzinfo=UTC), dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    ),
}


def drain_here(*channel_names: str) -> None:
    """Handle what is due inside the test's transaction (drain() would close the connection)."""
    with connection.cursor() as cursor:  # rows default to the statement's time: due now
        cursor.execute("UPDATE pgmsg_notification SET available_at = now()")
    worker = Worker(channel_names=channel_names, install_signal_handlers=False)
    for source in worker.sources:
        while worker.process(source):
            pass


@pytest.fixture
def received():
    listeners.every_field_received.clear()
    yield listeners.every_field_received
    listeners.every_field_received.clear()


@pytest.mark.django_db
@pytest.mark.parametrize("column", sorted(FIELD_VALUES))
def test_every_field_type_survives_a_trigger_channel(column, received):
    row = EveryField.objects.create(**{column: FIELD_VALUES[column]})
    drain_here("every_field_changed")
    assert not Notification.objects.exists(), Notification.objects.values("last_error")
    assert not NotificationDeadLetter.objects.exists(), NotificationDeadLetter.objects.values(
        "last_error"
    )
    (got,) = received
    stored = EveryField.objects.get(pk=row.pk)
    value = getattr(got, column)
    assert value == getattr(stored, column)
    assert type(value) is type(getattr(stored, column))


@pytest.mark.django_db
@pytest.mark.parametrize("column", ["foreign_key", "one_to_one"])
def test_relations_survive_a_trigger_channel(column, received):
    order = Order.objects.create(reference="rel")
    EveryField.objects.create(**{column: order})
    drain_here("every_field_changed")
    (got,) = received
    assert getattr(got, column + "_id") == order.pk
    assert getattr(got, column) == order


@pytest.mark.django_db
def test_a_generated_column_survives_a_trigger_channel(received):
    EveryField.objects.create(small=21)
    drain_here("every_field_changed")
    (got,) = received
    assert got.generated == 42


@pytest.mark.django_db
def test_a_malformed_trigger_payload_is_dead_at_once_saying_which_column():
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgmsg_notification (channel, payload) VALUES "
            """('order_changed', '{"op": "INSERT", "old": null, "new": {"id": "x"}}'),"""
            """('order_changed', '{"op": "INSERT", "old": null, "new": [1]}'),"""
            """('order_changed', '"just text"')"""
        )
    drain_here("order_changed")
    assert not Notification.objects.exists()
    dead = list(NotificationDeadLetter.objects.order_by("id"))
    assert [(n.state, n.attempts) for n in dead] == [("dead", 1)] * 3
    assert "not retried" in dead[0].last_error
    assert "new.id = 'x' does not fit BigAutoField" in dead[0].last_error
    assert "'new' is not a row" in dead[1].last_error
    assert "is not {op, old, new}" in dead[2].last_error
    assert not Effect.objects.exists()


# -- payload edges of declared channels -----------------------------------------------------


def stored_and_loaded(message):
    """Send ``message``, and decode its stored row the way the worker does."""
    pgmsg.notify(message)
    with connection.cursor() as cursor:
        cursor.execute("SELECT payload::text FROM pgmsg_notification ORDER BY id DESC LIMIT 1")
        return payloads.load(type(message), json.loads(cursor.fetchone()[0]))


@pytest.mark.django_db
def test_a_time_keeps_its_utc_offset():
    at = dt.time(10, 30, 0, 5, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    got = stored_and_loaded(Edges(at=at, ratio=1.0))
    assert got.at == at and got.at.utcoffset() == dt.timedelta(hours=2)


@pytest.mark.django_db
def test_negative_zero_arrives_as_zero():
    # jsonb numbers are numeric, which has no negative zero (documented in docs/channels.md).
    got = stored_and_loaded(Edges(at=dt.time(1), ratio=-0.0))
    assert got.ratio == 0.0 and math.copysign(1, got.ratio) == 1.0


@pytest.mark.django_db
def test_a_nul_character_is_refused_with_a_pgmsg_error_saying_why():
    with pytest.raises(errors.PayloadError, match=r"NUL character .*jsonb cannot store"):
        pgmsg.notify(Edges(at=dt.time(1), ratio=1.0, text="a\x00b"))
    with pytest.raises(errors.PayloadError, match=r"NUL character"):
        pgmsg.notify_many([Edges(at=dt.time(1), ratio=1.0, text="\x00")])
    assert not Notification.objects.exists()


@pytest.mark.django_db
def test_a_backslash_before_u0000_is_no_nul():
    got = stored_and_loaded(Edges(at=dt.time(1), ratio=1.0, text="a\\u0000b\\"))
    assert got.text == "a\\u0000b\\"
