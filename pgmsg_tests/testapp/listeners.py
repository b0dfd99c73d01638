"""Listeners of the test channels: each records its effect in the Effect table."""

import os
import signal
import time

from django.db import connection

import pgmsg
from pgmsg_tests.testapp.channels import Poison, Shout, Typed, Work
from pgmsg_tests.testapp.models import Effect


@pgmsg.listener(Work)
def record_work(message: Work) -> None:
    if message.sleep:
        time.sleep(message.sleep)
    if message.hold_until:
        hold_until_exists(message.hold_until)
    Effect.objects.create(
        channel="test.work", key=message.key, listener="record_work", worker_pid=os.getpid()
    )
    if message.always_fail:
        raise RuntimeError(f"work {message.key} always fails")
    if pgmsg.current_delivery().attempts < message.fail_times:
        raise RuntimeError(
            f"work {message.key} fails on attempt {pgmsg.current_delivery().attempts + 1}"
        )


def hold_until_exists(path: str, limit: float = 120.0) -> None:
    # A query now and then, so that the held transaction is never idle long enough for the
    # test WORKER_IDLE_TIMEOUT to end it.
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        time.sleep(0.1)


@pgmsg.listener(Work)
def second_listener(message: Work) -> None:
    Effect.objects.create(
        channel="test.work", key=message.key, listener="second_listener", worker_pid=os.getpid()
    )


@pgmsg.listener(Typed)
def record_typed(message: Typed) -> None:
    Effect.objects.create(
        channel="test.typed",
        key=str(message.ident),
        data={
            "when": message.when.isoformat(),
            "day": message.day.isoformat(),
            "amount": str(message.amount),
            "colour": message.colour.value,
            "tags": message.tags,
            "extra": message.extra,
            "note": message.note,
            "types": [
                type(message.when).__name__,
                type(message.amount).__name__,
                type(message.ident).__name__,
                type(message.colour).__name__,
            ],
        },
    )


@pgmsg.listener(Poison)
def die(message: Poison) -> None:
    Effect.objects.create(channel="test.poison", key=message.key, worker_pid=os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)


#: What the every_field_changed listener received, for in-process tests to look at.
every_field_received: list = []


@pgmsg.listener("every_field_changed")
def record_every_field(change: pgmsg.RowChange) -> None:
    every_field_received.append(change.new)


@pgmsg.listener(Shout)
def record_shout(message: Shout) -> None:
    Effect.objects.create(channel="test.shout", key=message.text, worker_pid=os.getpid())


@pgmsg.listener("order_changed")
def record_order_change(change: pgmsg.RowChange) -> None:
    old, new = change.old, change.new
    Effect.objects.create(
        channel="order_changed",
        key=(new or old).reference,
        data={
            "op": change.operation,
            "old": None
            if old is None
            else {"reference": old.reference, "total": str(old.total), "id": old.pk},
            "new": None
            if new is None
            else {
                "reference": new.reference,
                "total": str(new.total),
                "id": new.pk,
                "weight": new.weight,
                "details": new.details,
                "placed_at": new.placed_at.isoformat() if new.placed_at else None,
                "types": [type(new.total).__name__, type(new.weight).__name__],
            },
        },
    )


from pgmsg_tests.testapp import async_handlers  # noqa: E402,F401,I001
from pgmsg_tests.testapp import events_handlers  # noqa: E402,F401
from pgmsg_tests.testapp import inbox_handlers  # noqa: E402,F401
from pgmsg_tests.testapp import bridge_handlers  # noqa: E402,F401
from pgmsg_tests.testapp import outbox_declarations  # noqa: E402,F401

if os.environ.get("PGMSG_TEST_LOGICAL"):  # a relay process of test_logical.py
    from pgmsg_tests.testapp import logical_outboxes  # noqa: E402

    logical_outboxes.declare()
    logical_outboxes.declare_per_broker()
