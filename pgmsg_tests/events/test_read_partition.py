"""A worker holds a partition and reads its events through the subscription's read function
(subscriptions.sql, read_partition): pgmsg_read_partition for one partition (migrations 0019
and 0020), the function create_partition_read makes for more. Both return the partition once,
in a first row of its own, then the events that read_all's statement (read_ordered, the
bucket as a filter) returns for the same partition, for every shape of subscription."""

import pytest
from django.db import connection, transaction

import pgmsg
from pgmsg.events import reads, subscriptions
from pgmsg.events.store import START
from pgmsg.events.subscription_source import EVENT_END, HORIZON_USED, read_parameters, read_query
from pgmsg.events.subscriptions import ensure_partitions

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
            assert all(row[:7] + row[EVENT_END:] == (None,) * 8 for row in rows[1:])
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
