"""A worker holds a partition and reads its events through the subscription's read function
(subscriptions.sql, read_partition): pgmsg_read_partition for one partition (events/functions.sql),
the function subscriptions.partition_read makes from it for more. Both return the partition
once, in a first row of its own, then the events that read_all's statement (read_ordered, the
bucket as a filter) returns for the same partition, for every shape of subscription; the
partition's row also says whether a crash is on record."""

import threading

import pytest
from django.db import connection, connections, transaction

import pgmsg
from pgmsg.events import reads, subscriptions
from pgmsg.events.partition_reads import (
    CRASH_ON_RECORD,
    EVENT_END,
    HORIZON_USED,
    read_parameters,
    read_query,
)
from pgmsg.events.store import START
from pgmsg.events.subscriptions import ensure_partitions
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.helpers import ended_transaction_id, record_claim

pytestmark = pytest.mark.django_db(transaction=True)


class Shipped(pgmsg.Event, type="test.readpartition.shipped"):
    n: int


class Billed(pgmsg.Event, type="test.readpartition.billed"):
    n: int


SHAPES = [
    pgmsg.Subscription("test-rp-category", category="rp", partitions=1),
    pgmsg.Subscription("test-rp-all", partitions=1),
    pgmsg.Subscription("test-rp-types", category="rp", partitions=1),
    pgmsg.Subscription("test-rp-buckets", category="rp", partitions=2),
    pgmsg.Subscription("test-rp-buckets-all", partitions=3),
    pgmsg.Subscription("test-rp-buckets-data", category="rp", partitions=2, partition_by="data.n"),
    pgmsg.Subscription("test-rp-buckets-types", partitions=2, partition_by="metadata.tenant"),
]
for _sub in SHAPES:
    _types = (Shipped,) if "types" in _sub.name else (Shipped, Billed)
    _sub.handler(*_types)(lambda recorded: None)


@pytest.mark.parametrize("sub", SHAPES, ids=lambda s: s.name)
@pytest.mark.parametrize("limit", [100, 3])
def test_the_read_function_reads_what_read_all_reads(sub, limit):
    for i in range(6):
        meta = {"tenant": f"t{i}"}
        pgmsg.append(f"rp-{i % 3}", [Shipped(n=i, metadata=meta), Billed(n=i + 1, metadata=meta)])
        pgmsg.append(f"other-{i % 2}", Shipped(n=i, metadata=dict(meta)))
    with connection.cursor() as cursor:
        with transaction.atomic():
            ensure_partitions(sub, cursor)
        xmin = reads.read_horizon(cursor)
    assert subscriptions.read_function(sub) in read_query(sub)
    everything = set()
    for partition in range(sub.partitions):
        with transaction.atomic(), connection.cursor() as cursor:
            expected = [
                e.position
                for e in reads.read_ordered(
                    cursor,
                    after=START,
                    xmin=xmin,
                    category=sub.category,
                    types=sub.types,
                    partition=(partition, sub.partitions, sub.key_source, sub.key),
                    limit=limit,
                )
            ]
            cursor.execute(read_query(sub), read_parameters(sub, partition, xmin, limit))
            rows = cursor.fetchall()
            held, events = read_rows(rows)
            assert [row[0] for row in events] == expected
            # The partition once, first, its event columns NULL; its columns NULL on the events'.
            assert held[0] is not None and held[6] is True  # its id; no floor: it holds
            assert rows[0][7:EVENT_END] == (None,) * 9
            assert rows[0][HORIZON_USED] == xmin  # the horizon given
            assert all(row[:7] + row[EVENT_END:] == (None,) * 9 for row in rows[1:])
            # Without a horizon given, the function reads it itself and returns it.
            cursor.execute(read_query(sub), read_parameters(sub, partition, None, limit))
            rows = cursor.fetchall()
            assert rows[0][HORIZON_USED] >= xmin
            assert read_rows(rows) == (held, events)
            everything.update(row[0] for row in events)
        if limit == 100:
            assert expected, f"partition {partition} holds no event: the test proves nothing"
    # Every event the subscription handles is in one of its partitions (a big enough limit).
    with connection.cursor() as cursor:
        every = reads.read_ordered(
            cursor, after=START, xmin=xmin, category=sub.category, types=sub.types, limit=1000
        )
    if limit == 100:
        assert everything == {e.position for e in every}
        assert {e.stream_name.partition("-")[0] for e in every} == (
            {"rp", "other"} if sub.category is None else {"rp"}
        )


def read_rows(rows: list[tuple]) -> tuple[tuple, list[tuple]]:
    """What the worker takes from a read: the partition's columns (from the first row) and the
    events' (from the rows that have one)."""
    return rows[0][:7], [row[7:EVENT_END] for row in rows if row[7] is not None]


# -- a read function dropped under a running worker ----------------------------------------------

HEALED = pgmsg.Subscription("test-rp-heal", category="heal", partitions=2)
healed: list[int] = []
HEALED.handler(Shipped)(lambda recorded: healed.append(recorded.event.n))


def test_a_worker_makes_a_dropped_read_function_again_and_goes_on():
    """The function lives outside the migrations (migrate pgmsg zero and back, or a hand
    clean-up, can drop it under a running worker): the failing read is a database error like
    any, the worker reconnects, and its next round makes the function again."""
    from pgmsg.core.worker import Worker

    healed.clear()
    worker = Worker(subscriptions=[HEALED.name], install_signal_handlers=False)
    thread = threading.Thread(target=lambda: (worker.run(), connections.close_all()))
    thread.start()
    try:
        pgmsg.append("heal-1", [Shipped(n=i) for i in range(3)])
        wait_for(lambda: sorted(healed) == [0, 1, 2], message="the first events handled")
        with connection.cursor() as cursor:
            cursor.execute(f"DROP FUNCTION {subscriptions.read_function(HEALED)}")
        pgmsg.append("heal-2", [Shipped(n=i) for i in range(3, 6)])
        wait_for(lambda: sorted(healed) == list(range(6)), message="the events after the drop")
    finally:
        worker.stop()
        thread.join(timeout=60)
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regproc(%s) IS NOT NULL", [subscriptions.read_function(HEALED)])
        assert cursor.fetchone()[0]


# -- the read prepared on the worker's connection -------------------------------------------------

PREPARED = pgmsg.Subscription("test-rp-prepared", category="prep", partitions=1)
PREPARED.handler(Shipped)(lambda recorded: None)


def test_the_read_is_prepared_once_on_the_workers_connection_with_or_without_a_horizon():
    """The read goes by name: one statement per partition, floor and batch size, whose
    horizon is its parameter, NULL when the function is to read the horizon itself (a
    wake-up's read) or the horizon given."""
    from pgmsg.core.worker import Worker

    source = Worker(subscriptions=[PREPARED.name], install_signal_handlers=False).sources[0]
    with transaction.atomic(), connection.cursor() as cursor:
        ensure_partitions(PREPARED, cursor)
    pgmsg.append("prep-1", Shipped(n=1))
    connection.close()  # a new session: nothing prepared on it yet

    def read(xmin: int | None) -> tuple[list[int], int | None]:
        with transaction.atomic():
            rows, horizon = source._lock_and_read(connection, 0, xmin, 100, None)
            transaction.set_rollback(True)  # the checkpoint stays: every read reads the same
        return [row[7] for row in rows if row[7] is not None], horizon

    def prepared_reads() -> list[tuple[str, str]]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT name, statement FROM pg_prepared_statements WHERE statement LIKE %s",
                [f"%{subscriptions.read_function(PREPARED)}(%"],
            )
            return cursor.fetchall()

    positions, horizon = read(None)  # the function reads the horizon itself
    assert len(positions) == 1 and horizon is not None
    (statement,) = prepared_reads()
    assert statement[0].startswith("pgmsg_") and "$1::text" in statement[1]  # the horizon
    assert read(horizon) == (positions, horizon)
    assert read(None)[0] == positions
    assert prepared_reads() == [statement]


# -- whether a crash is on record ----------------------------------------------------------------


@pytest.mark.parametrize("sub", [SHAPES[0], SHAPES[3]], ids=lambda s: s.name)
def test_the_read_says_whether_a_claim_of_events_whose_batch_died_is_on_record(sub):
    # The worker's handlers wait for its claim record's answer only when one is (claims.py).
    with connection.cursor() as cursor:
        with transaction.atomic():
            ensure_partitions(sub, cursor)
        cursor.execute("DELETE FROM pgmsg_claim")

    def crash_on_record() -> bool:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(read_query(sub), read_parameters(sub, 0, None, 10))
            return cursor.fetchall()[0][CRASH_ON_RECORD]

    assert crash_on_record() is False
    record_claim("event", [1, 2], ended_transaction_id(commit=True))  # a batch that committed
    record_claim("notification", [1, 2], ended_transaction_id(commit=False))  # another kind's
    assert crash_on_record() is False
    record_claim("event", [1, 2], ended_transaction_id(commit=False))
    assert crash_on_record() is True
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM pgmsg_claim WHERE kind = 'event'")
    assert crash_on_record() is False
