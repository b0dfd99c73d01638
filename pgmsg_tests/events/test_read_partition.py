"""A subscription of one partition reads through pgmsg_read_partition (migrations 0019 and 0020,
a plan kept for the session): the same partition and the same events, in the same columns, as
the lock_and_read statement that subscriptions of more partitions use, for every shape of
subscription. The statement repeats the partition's columns on each event's row; the function
returns them once, in a first row of their own (the worker reads both alike: read_rows)."""

import pytest
from django.db import connection, transaction

import pgmsg
from pgmsg.events import reads
from pgmsg.events.subscription_source import EVENT_END, HORIZON_USED, read_parameters
from pgmsg.events.subscriptions import QUERIES, ensure_partitions

pytestmark = pytest.mark.django_db(transaction=True)


class Shipped(pgmsg.Event, type="test.readpartition.shipped"):
    n: int


class Billed(pgmsg.Event, type="test.readpartition.billed"):
    n: int


SHAPES = [
    pgmsg.Subscription("test-rp-category", category="rp", partitions=1),
    pgmsg.Subscription("test-rp-all", partitions=1),
    pgmsg.Subscription("test-rp-types", category="rp", partitions=1),
]
SHAPES[0].handler(Shipped, Billed)(lambda recorded: None)
SHAPES[1].handler(Shipped, Billed)(lambda recorded: None)
SHAPES[2].handler(Shipped)(lambda recorded: None)


@pytest.mark.parametrize("sub", SHAPES, ids=lambda s: s.name)
@pytest.mark.parametrize("limit", [100, 3])
def test_the_function_reads_what_the_statement_reads(sub, limit):
    for i in range(4):
        pgmsg.append(f"rp-{i % 2}", [Shipped(n=i), Billed(n=i)])
        pgmsg.append(f"other-{i % 2}", Shipped(n=i))
    with connection.cursor() as cursor:
        ensure_partitions(sub, cursor)
        xmin = reads.read_horizon(cursor)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(QUERIES["lock_and_read"], read_parameters(sub, 0, xmin, limit))
        expected = read_rows(cursor.fetchall())
        cursor.execute(QUERIES["read_partition"], read_parameters(sub, 0, xmin, limit))
        function_rows = cursor.fetchall()
        assert read_rows(function_rows) == expected
        # The partition once, first, its event columns NULL; its columns NULL on the events'.
        assert function_rows[0][7:EVENT_END] == (None,) * 9
        assert function_rows[0][HORIZON_USED] == xmin  # the horizon given
        assert all(row[:7] + row[EVENT_END:] == (None,) * 8 for row in function_rows[1:])
        # Without a horizon given, the function reads it itself and returns it.
        cursor.execute(QUERIES["read_partition"], read_parameters(sub, 0, None, limit))
        rows = cursor.fetchall()
        assert rows[0][HORIZON_USED] >= xmin
        assert read_rows(rows) == expected
    held, events = expected
    assert held[0] is not None and held[6] is True  # the partition's id; no floor: it holds
    categories = {row[2].partition("-")[0] for row in events}  # stream_name's category
    assert len(events) == min(limit, {"test-rp-all": 12, "test-rp-category": 8}.get(sub.name, 4))
    assert categories == ({"rp", "other"} if sub.category is None else {"rp"})


def read_rows(rows: list[tuple]) -> tuple[tuple, list[tuple]]:
    """What the worker takes from a read: the partition's columns (from the first row) and the
    events' (from the rows that have one)."""
    return rows[0][:7], [row[7:EVENT_END] for row in rows if row[7] is not None]
