"""Each subscription partition reads only its own events: its read is a range of an index whose
key holds the partition's bucket, not a scan of every event filtered by a hash."""

import json

import pytest
from django.db import connection, transaction

import pgmsg
from pgmsg.events import reads, subscriptions
from pgmsg.events.partition_reads import read_parameters, read_query
from pgmsg.events.store import START
from pgmsg_tests.testapp.events_handlers import Step

pytestmark = pytest.mark.django_db(transaction=True)


def read_params(sub: pgmsg.Subscription, partition: int, limit: int = 1000) -> dict:
    """The parameters of the read a worker makes for one partition (read_partition), with
    every type and a horizon past every event."""
    return {**read_parameters(sub, partition, 100000000, limit), "types": None}


def read_plans(
    sub: pgmsg.Subscription,
    partition: int,
    *,
    analyze: bool = False,
    limit: int = 1000,
    fresh_statistics: bool = True,
):
    """The plans (EXPLAIN's JSON) of the event reads inside the partition's read function,
    with the worker's parameters, as auto_explain (PostgreSQL's contrib module) logs the
    statements a function runs. Statistics are of the events as they now are (not of an
    earlier test's), unless ``fresh_statistics`` is false (then the worker's own). Sequential
    scans are ruled out so that a tiny table still shows which index the read can use; the
    session's kept plans are dropped first, so that the function plans its statements under
    these settings."""
    logged: list[str] = []
    conn = connection.connection

    def keep(diagnostic) -> None:
        logged.append(diagnostic.message_primary)

    with transaction.atomic(), connection.cursor() as cursor:
        subscriptions.ensure_partitions(sub, cursor)
        if fresh_statistics:
            cursor.execute("ANALYZE pgmsg_event")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'")
        cursor.execute(
            "SET LOCAL enable_seqscan = off; DISCARD PLANS; "
            "SET LOCAL auto_explain.log_min_duration = 0; "
            "SET LOCAL auto_explain.log_nested_statements = on; "
            "SET LOCAL auto_explain.log_format = json; "
            f"SET LOCAL auto_explain.log_analyze = {'on' if analyze else 'off'}; "
            "SET LOCAL client_min_messages = log"
        )
        conn.add_notice_handler(keep)
        try:
            cursor.execute(read_query(sub), read_params(sub, partition, limit))
        finally:
            conn.remove_notice_handler(keep)
        transaction.set_rollback(True)  # the partition's lock, nothing else
    plans = [json.loads(text[text.index("{") :]) for text in logged if "plan:" in text]
    return [p["Plan"] for p in plans if "FROM pgmsg_event AS ev" in p["Query Text"]]


def index_scans(plan: dict, indexes: set[str]) -> list[dict]:
    """The plan's nodes that scan one of those indexes."""
    found = [plan] if plan.get("Index Name") in indexes else []
    for child in plan.get("Plans", []):
        found += index_scans(child, indexes)
    return found


def all_event_indexes() -> set[str]:
    """Every index of pgmsg_event and of its months."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indexrelid::regclass::text FROM pg_index AS i "
            "WHERE i.indrelid = 'pgmsg_event'::regclass OR i.indrelid IN "
            "(SELECT inhrelid FROM pg_inherits WHERE inhparent = 'pgmsg_event'::regclass)"
        )
        return {row[0] for row in cursor.fetchall()}


def index_and_its_partitions(index_name: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s",
            [index_name],
        )
        return {index_name, *(row[0] for row in cursor.fetchall())}


@pytest.mark.parametrize(
    ("category", "partition_by"),
    [("seq", "stream"), ("seq", "data.n"), (None, "stream"), (None, "metadata.tenant")],
)
def test_a_partition_read_is_an_index_range_of_its_own_bucket(category, partition_by):
    name = f"test-index-{category or 'all'}-{partition_by.replace('.', '-')}"
    sub = pgmsg.Subscription(name, category=category, partitions=3, partition_by=partition_by)
    index_name, _ = subscriptions.partition_index(sub)
    for stream in range(6):
        pgmsg.append(f"seq-{stream}", [Step(n=i) for i in range(5)])

    (plan,) = read_plans(sub, 2, analyze=True)

    # pgmsg_event is partitioned by month (docs/storage.md): the read is one range per month,
    # each on that month's copy of the subscription's index.
    mine = index_and_its_partitions(index_name)
    scans = index_scans(plan, mine)
    assert scans, plan
    others = index_scans(plan, all_event_indexes() - mine)
    assert not others, json.dumps(plan, indent=1)  # no other read
    for scan in scans:
        assert "hashtextextended" in scan["Index Cond"], plan
        # Nothing read is thrown away (the function's plan keeps the filters of its optional
        # parameters, the types and the floor, which remove nothing when not given).
        assert scan.get("Rows Removed by Filter", 0) == 0, scan


def test_subscriptions_with_the_same_key_and_count_share_one_index():
    first = pgmsg.Subscription("test-index-share-a", category="seq", partitions=5)
    second = pgmsg.Subscription("test-index-share-b", category="seq", partitions=5)
    other = pgmsg.Subscription("test-index-share-c", category="seq", partitions=6)
    assert subscriptions.partition_index(first)[0] == subscriptions.partition_index(second)[0]
    assert subscriptions.partition_index(first)[0] != subscriptions.partition_index(other)[0]
    assert subscriptions.partition_index(pgmsg.Subscription("test-index-one", partitions=1)) is None


def test_the_indexed_read_returns_what_the_hash_filter_returns():
    pgmsg.append("seq-a", [Step(n=i) for i in range(3)])
    pgmsg.append("seq-b", [Step(n=i) for i in range(3)])
    pgmsg.append("seq-c", [Step(n=i) for i in range(3)])
    sub = pgmsg.Subscription("test-index-same", category="seq", partitions=2)
    with connection.cursor() as cursor:
        xmin = reads.read_horizon(cursor)
        seen_before = [[e.position for e in read_partition(cursor, sub, p, xmin)] for p in range(2)]
        with transaction.atomic():
            subscriptions.ensure_partitions(sub, cursor)
        seen_after = [[e.position for e in read_partition(cursor, sub, p, xmin)] for p in range(2)]
        cursor.execute(
            "SELECT position FROM pgmsg_event WHERE category = 'seq' "
            "AND transaction_id < %s::text::xid8",
            [str(xmin)],
        )
        every = {row[0] for row in cursor.fetchall()}
    assert seen_after == seen_before
    assert sorted(seen_after[0] + seen_after[1]) == sorted(every)


def read_partition(cursor, sub, partition, xmin):
    return reads.read_ordered(
        cursor,
        after=START,
        xmin=xmin,
        category=sub.category,
        partition=(partition, sub.partitions, sub.key_source, sub.key),
        limit=1000,
    )


def test_a_new_partition_index_gets_statistics_so_the_read_stops_at_its_limit():
    # Events analyzed before the subscription's index exists, as on a store that ran before
    # the subscription was declared: without statistics of the index's expression the planner
    # guesses a bucket holds a handful of events, sorts the whole bucket and then cuts it to
    # the limit, so each batch reads the partition's entire backlog.
    for stream in range(40):
        pgmsg.append(f"seq-{stream}", [Step(n=i) for i in range(50)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgmsg_event")
    sub = pgmsg.Subscription("test-index-stats", category="seq", partitions=4)
    index_name, _ = subscriptions.partition_index(sub)
    with transaction.atomic(), connection.cursor() as cursor:
        subscriptions.ensure_partitions(sub, cursor)
        cursor.execute(
            "SELECT count(*) FROM pg_stats AS s JOIN pg_inherits AS i "
            "ON i.inhrelid = (quote_ident(s.schemaname) || '.' || quote_ident(s.tablename))"
            "::regclass JOIN pg_class AS p ON p.oid = i.inhparent WHERE p.relname = %s",
            [index_name],
        )
        assert cursor.fetchone()[0] > 0  # the month's copy of the index has statistics

    (plan,) = read_plans(sub, 1, analyze=True, limit=50, fresh_statistics=False)
    scanned = [
        scan["Actual Rows"] for scan in index_scans(plan, index_and_its_partitions(index_name))
    ]
    assert scanned, plan
    # The bucket holds about 500 events; an ordered index read stops after the 50 returned.
    assert sum(scanned) <= 50, plan
