"""Subscription reads skip sealed months wholly below their checkpoint, and never an event
after it: a late-committing transaction whose events span a month's end is delivered once,
and a checkpoint moved back (reset) reads every month again."""

import datetime as dt
import uuid

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction

import pgmsg
from pgmsg.core import partitions
from pgmsg.core.worker import Worker
from pgmsg.events import partitions as event_partitions
from pgmsg.events import subscription_operations, subscriptions
from pgmsg.events.source import SubscriptionSource
from pgmsg_dev.devdb import database_url

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = "pgmsg_event"


class Mark(pgmsg.Event, type="test.floor.mark"):
    n: int


handled: list[int] = []
floor_sub = pgmsg.Subscription("test-floor", category="floor", partitions=1)
floor_sub.handler(Mark)(lambda recorded: handled.append(recorded.event.n))


def month(offset: int) -> dt.datetime:
    return partitions.month_start(dt.datetime.now(dt.UTC), offset)


@pytest.fixture
def past_months():
    """Months -2 and -1 exist, and no gap lies between the oldest month and this one (a
    floor only passes over a contiguous run of the oldest months)."""
    handled.clear()
    with transaction.atomic(), connection.cursor() as cursor:
        existing = partitions.partitions(cursor, TABLE)
        oldest = min(
            [p.lower_time() for p in existing if not p.is_default] + [month(-2)],
        )
        start = partitions.month_start(oldest)
        while start < month(0):
            end = partitions.month_start(start, 1)
            if not any(p.lower_time() == start for p in existing if not p.is_default):
                partitions.create(cursor, TABLE, partitions.month_name(TABLE, start), start, end)
            start = end
    yield


def drain(source: SubscriptionSource, batch_size: int | None = None) -> None:
    Worker(
        sources=[source], until_idle=True, install_signal_handlers=False, batch_size=batch_size
    ).run()


def sealed() -> dict[str, int | None]:
    with connection.cursor() as cursor:
        return {m.name: m.below for m in event_partitions.ranges(cursor)}


def append_in(stream: str, n: int, moment: dt.datetime) -> None:
    """An event appended and committed now, moved into the month of ``moment`` (as if its
    transaction had begun then)."""
    pgmsg.append(stream, Mark(n=n))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {TABLE} SET recorded_at = %s WHERE stream_name = %s", [moment, stream]
        )


def insert(cursor, stream: str, version: int, n: int, moment: dt.datetime | None) -> None:
    """An event inserted in ``cursor``'s transaction, with that transaction's id, recorded in
    the month of ``moment`` (None: now)."""
    cursor.execute(
        f"INSERT INTO {TABLE} (stream_name, category, version, type, data, metadata, "
        "message_id, transaction_id, recorded_at) VALUES (%s, 'floor', %s, 'test.floor.mark', "
        "jsonb_build_object('n', %s::int), '{}', %s, pg_current_xact_id(), "
        "coalesce(%s, now()))",
        [stream, version, n, uuid.uuid4(), moment],
    )


def test_a_late_transaction_across_a_month_end_is_delivered_once_and_sealed_months_are_skipped(
    past_months,
):
    append_in("floor-old", 0, month(-2) + dt.timedelta(days=1))
    # A transaction that appends into last month and this one, and commits only after a later
    # transaction's append: its events sort before that append's, and last month must not be
    # sealed below them while it is open.
    late = psycopg.connect(database_url(connection.settings_dict))
    try:  # an open transaction left behind would hold up the test database's flush
        with late.cursor() as cursor:
            insert(cursor, "floor-late", 1, 1, month(-1) + dt.timedelta(days=3))
            insert(cursor, "floor-late", 2, 2, month(-1) + dt.timedelta(days=4))
            insert(cursor, "floor-late", 3, 3, None)
        pgmsg.append("floor-new", Mark(n=4))

        drain(SubscriptionSource(floor_sub))  # its maintenance seals what it may
        assert handled == [0]  # the open transaction holds the rest back
        seals = sealed()
        assert seals[partitions.month_name(TABLE, month(-2))] is not None
        assert seals[partitions.month_name(TABLE, month(-1))] is None  # its writer is open
        late.commit()
    finally:
        late.close()
    assert partitions.month_name(TABLE, month(-1)) in event_partitions.seal_partitions()
    # One event per read: every read after the first one has a floor, and last month, sealed
    # above the late transaction's id, must not be skipped.
    drain(SubscriptionSource(floor_sub), batch_size=1)
    assert handled == [0, 1, 2, 3, 4]

    # Past the late transaction, both past months lie wholly below the checkpoint: the read
    # skips them.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT checkpoint_transaction FROM pgmsg_subscription_partition "
            "WHERE subscription = %s",
            [floor_sub.name],
        )
        (checkpoint,) = cursor.fetchone()
        floor = event_partitions.floor(event_partitions.ranges(cursor), checkpoint)
    assert floor is not None and floor.at == month(0)


def test_a_sealed_month_refuses_rows_at_or_above_its_bound(past_months):
    append_in("floor-old", 0, month(-2) + dt.timedelta(days=1))
    event_partitions.seal_partitions()
    assert sealed()[partitions.month_name(TABLE, month(-2))] is not None
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        insert(cursor, "floor-later", 1, 9, month(-2) + dt.timedelta(days=2))


def test_a_reset_behind_sealed_months_reads_them_again(past_months):
    append_in("floor-old", 0, month(-2) + dt.timedelta(days=1))
    event_partitions.seal_partitions()
    pgmsg.append("floor-new", Mark(n=1))
    source = SubscriptionSource(floor_sub)
    drain(source)
    drain(source)  # every read now has a floor past last month
    assert handled == [0, 1]
    subscription_operations.reset(floor_sub.name)
    # As after a full batch, the source reads at once, without first looking at where the
    # partitions stand: its floor is for the old checkpoint, and the read must not use it.
    source._busy = True
    drain(source)
    assert handled == [0, 1, 0, 1]


def test_the_subscription_declared_here_reads_its_category():
    assert subscriptions.registry.get("test-floor").category == "floor"
