"""The inbox over weekly partitions: idempotency across them, retention by partition, and
partitions made ahead by pgmsg itself."""

import datetime as dt
import threading
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

import pgmsg
from pgmsg.core import partitions
from pgmsg.inbox import operations as inbox_ops
from pgmsg.inbox import retention
from pgmsg.models import InboxMessage
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.inbox.helpers import drain

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = "pgmsg_inbox_message"


def _week(offset: int) -> tuple[str, dt.datetime, dt.datetime]:
    """A week partition ``offset`` weeks from this one, made if missing."""
    start = partitions.week_start(dt.datetime.now(dt.UTC)) + offset * partitions.WEEK
    name = partitions.week_name(TABLE, start)
    with transaction.atomic(), connection.cursor() as cursor:
        if name not in {p.name for p in partitions.partitions(cursor, TABLE)}:
            partitions.create(cursor, TABLE, name, start, start + partitions.WEEK)
    return name, start, start + partitions.WEEK


def _partition_of(message_id: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT tableoid::regclass::text FROM {TABLE} WHERE message_id = %s", [message_id]
        )
        return [row[0] for row in cursor.fetchall()]


def _move(message_id: str, received_at: dt.datetime) -> None:
    InboxMessage.objects.filter(message_id=message_id).update(received_at=received_at)


def test_a_resent_message_id_is_recognised_whichever_partition_holds_the_first_copy():
    last_week, start, _ = _week(-1)
    for key in ("in-last-week", "in-default"):
        assert pgmsg.receive("test.inbox", key, type="work", payload={}).stored
    _move("in-last-week", start + dt.timedelta(hours=1))
    _move("in-default", start - dt.timedelta(days=400))
    assert _partition_of("in-last-week") == [last_week]
    assert _partition_of("in-default") == [f"{TABLE}_default"]

    assert not pgmsg.receive("test.inbox", "in-last-week", type="work", payload={}).stored
    again = pgmsg.receive_many(
        "test.inbox",
        [
            {"message_id": "in-default", "type": "work", "payload": {}},
            {"message_id": "fresh", "type": "work", "payload": {}},
        ],
    )
    assert [(r.message_id, r.stored) for r in again] == [("in-default", False), ("fresh", True)]
    assert InboxMessage.objects.filter(message_id__startswith="in-").count() == 2
    # The same id in another inbox is another message.
    assert pgmsg.receive("test.ordered", "in-last-week", type="step", payload={}).stored


def test_one_batch_over_several_weeks_acknowledges_each_message_in_its_own_partition():
    # The ack names the weeks of the batch's receipt times, to the microsecond: a message at
    # either end (in the default partition, and in this week's) must be marked processed.
    _, start, _ = _week(-1)
    for key in ("oldest", "last-week", "newest"):
        assert pgmsg.receive("test.inbox", key, type="work", payload={}).stored
    _move("oldest", start - dt.timedelta(days=400, microseconds=1))
    _move("last-week", start + dt.timedelta(microseconds=999_999))
    assert _partition_of("oldest") == [f"{TABLE}_default"]
    assert drain().handled == 3
    assert {m.message_id: m.status for m in InboxMessage.objects.all()} == dict.fromkeys(
        ("oldest", "last-week", "newest"), "processed"
    )
    assert drain().handled == 0  # none comes back


def test_a_concurrent_receipt_into_another_partition_waits_for_the_first_and_skips():
    last_week, start, _ = _week(-1)
    first = psycopg.connect(database_url(connection.settings_dict), autocommit=False)
    try:
        # A producer's open transaction holds the first copy, in last week's partition.
        first.execute(
            f"INSERT INTO {TABLE} (inbox, message_id, type, payload, received_at) "
            "VALUES ('test.inbox', 'raced', 'work', '{}', %s)",
            [start + dt.timedelta(hours=2)],
        )
        outcome = []
        second = threading.Thread(
            target=lambda: outcome.append(
                _receive_in_thread("test.inbox", "raced", type="work", payload={})
            )
        )
        second.start()
        second.join(timeout=1.0)
        assert second.is_alive(), "the second receipt should wait for the first to commit"
        first.commit()
        second.join(timeout=30)
    finally:
        first.close()
    assert outcome == [False]
    assert _partition_of("raced") == [last_week]


def _receive_in_thread(*args, **kwargs) -> bool:
    try:
        return pgmsg.receive(*args, **kwargs).stored
    finally:
        connection.close()


def test_a_receipt_under_repeatable_read_is_refused_with_the_reason():
    with pytest.raises(DatabaseError, match="READ COMMITTED or SERIALIZABLE"):
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            pgmsg.receive("test.inbox", "rr", type="work", payload={})


def _settled_rows(n: int, received_at: dt.datetime, prefix: str, *, hours_ago: float = 100):
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (inbox, message_id, type, payload, status, received_at, "
            "processed_at) SELECT 'test.inbox', %s || g, 'work', '{}', 'processed', %s, "
            "now() - make_interval(hours => %s) FROM generate_series(1, %s) AS g",
            [prefix, received_at, hours_ago, n],
        )


def test_retention_drops_a_past_partition_whose_rows_have_all_expired():
    name, start, _ = _week(-2)
    _settled_rows(50, start + dt.timedelta(days=1), "old-")
    assert inbox_ops.purge() == {"processed": 50, "dead": 0}
    with connection.cursor() as cursor:
        assert name not in {p.name for p in partitions.partitions(cursor, TABLE)}
    assert not InboxMessage.objects.filter(message_id__startswith="old-").exists()
    # A late row for that week now lands in the default partition.
    _settled_rows(1, start + dt.timedelta(days=1), "late-")
    assert _partition_of("late-1") == [f"{TABLE}_default"]


def test_retention_empties_a_partition_but_gives_back_the_rows_it_must_keep():
    name, start, _ = _week(-1)
    _settled_rows(40, start + dt.timedelta(days=1), "gone-")
    _settled_rows(2, start + dt.timedelta(days=1), "recent-", hours_ago=1)
    pgmsg.receive("test.inbox", "still-pending", type="work", payload={})
    _move("still-pending", start + dt.timedelta(days=2))
    kept_before = dict(
        InboxMessage.objects.exclude(message_id__startswith="gone-").values_list("message_id", "id")
    )
    assert inbox_ops.purge() == {"processed": 40, "dead": 0}
    kept_after = dict(InboxMessage.objects.values_list("message_id", "id"))
    assert kept_after == kept_before
    assert _partition_of("still-pending") == [name]
    # What was kept still works: the pending message is handled, its id still deduplicates.
    drain()
    assert InboxMessage.objects.get(message_id="still-pending").status == "processed"
    assert not pgmsg.receive("test.inbox", "recent-1", type="work", payload={}).stored


def test_a_partition_that_keeps_more_than_the_bound_waits(monkeypatch):
    _, start, _ = _week(-1)
    _settled_rows(5, start + dt.timedelta(days=1), "gone-")
    _settled_rows(3, start + dt.timedelta(days=1), "recent-", hours_ago=1)
    monkeypatch.setattr(retention, "MOST_KEPT", 2)
    assert inbox_ops.purge() == {"processed": 0, "dead": 0}
    assert InboxMessage.objects.count() == 8


def _drop_future_weeks() -> list[str]:
    this_week = partitions.week_start(dt.datetime.now(dt.UTC))
    with transaction.atomic(), connection.cursor() as cursor:
        future = [
            p.name
            for p in partitions.partitions(cursor, TABLE)
            if not p.is_default and p.lower_time() > this_week
        ]
        for name in future:
            partitions.drop(cursor, name)
    return future


def test_pgmsg_partitions_makes_the_weeks_ahead_and_lists_them():
    dropped = _drop_future_weeks()
    assert len(dropped) == retention.WEEKS_AHEAD
    out = StringIO()
    call_command("pgmsg_partitions", stdout=out)
    for name in dropped:
        assert f"created {name}" in out.getvalue()
    listing = StringIO()
    call_command("pgmsg_partitions", "--list", stdout=listing)
    assert f"{TABLE}  {TABLE}_default  DEFAULT" in listing.getvalue()
    assert "pgmsg_event  pgmsg_event_default  DEFAULT" in listing.getvalue()
    assert "created" not in listing.getvalue()


def test_the_worker_makes_missing_partitions_itself_and_keeps_serving():
    dropped = _drop_future_weeks()
    pgmsg.receive("test.inbox", "w-1", type="work", payload={})
    drain()
    with connection.cursor() as cursor:
        names = {p.name for p in partitions.partitions(cursor, TABLE)}
    assert set(dropped) <= names
    pgmsg.receive("test.inbox", "w-2", type="work", payload={})
    drain()
    assert set(InboxMessage.objects.values_list("status", flat=True)) == {"processed"}


@pytest.mark.processes
def test_a_running_worker_keeps_serving_while_partitions_are_made_and_dropped(workers):
    _drop_future_weeks()
    workers.start("--inbox", "test.inbox", "--batch-size", "20")
    old_name, start, _ = _week(-2)
    for n in range(60):
        pgmsg.receive("test.inbox", f"live-{n}", type="work", payload={})
        if n == 20:
            call_command("pgmsg_partitions", stdout=StringIO())
        if n == 40:
            _settled_rows(30, start + dt.timedelta(days=1), "expired-")
            assert inbox_ops.purge()["processed"] == 30  # the partition goes under the worker
    wait_for(
        lambda: (
            InboxMessage.objects.filter(status="processed", message_id__startswith="live-").count()
            == 60
        ),
        message="the worker stopped handling messages",
    )
    with connection.cursor() as cursor:
        assert old_name not in {p.name for p in partitions.partitions(cursor, TABLE)}


def test_a_row_whose_status_changes_while_retention_waits_for_the_partition_stays(monkeypatch):
    """A dead row is replayed (back to pending) in a transaction that retention must wait for:
    retention decides what to keep only once it holds the partition, so the row stays."""
    name, start, _ = _week(-2)
    _settled_rows(30, start + dt.timedelta(days=1), "gone-")
    _settled_rows(1, start + dt.timedelta(days=1), "replayed-")
    InboxMessage.objects.filter(message_id="replayed-1").update(
        status="dead", processed_at=None, last_failed_at=start + dt.timedelta(days=1)
    )
    # Give the waiting retention all the time the test needs (the default gives up after 2 s).
    monkeypatch.setitem(partitions.QUERIES, "lock_timeout", "SET LOCAL lock_timeout = '120s'")
    result = {}

    def retain():
        try:
            result["removed"] = inbox_ops.purge()
        finally:
            connection.close()

    with psycopg.connect(database_url(connection.settings_dict)) as replay:
        replay.execute(f"UPDATE {TABLE} SET status = 'pending' WHERE message_id = 'replayed-1'")
        worker = threading.Thread(target=retain)
        worker.start()
        wait_for(
            lambda: (
                replay.execute(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
                    [name],
                ).fetchone()[0]
                == 1
            ),
            message="retention waits for the partition",
        )
        replay.commit()
        worker.join(timeout=120)
    assert result["removed"] == {"processed": 30, "dead": 0}
    assert InboxMessage.objects.get(message_id="replayed-1").status == "pending"
    assert _partition_of("replayed-1") == [name]


def _advisory_locks_held() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            # Not the wake-up's shared lock (core/wake.py): one per transaction and inbox.
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
            "AND classid <> 1885826370"
        )
        return cursor.fetchone()[0]


def test_one_transaction_receives_50000_new_ids():
    """A receipt takes no lock of its own: its key's entry in pgmsg_inbox_key's unique index
    is what a concurrent duplicate waits on (one lock per id ran out of shared memory past
    about 5,000 ids; then one of 1,024 buckets per id until migration 0033)."""
    messages = [{"message_id": f"bulk-{n}", "type": "work", "payload": {}} for n in range(50_000)]
    with transaction.atomic():
        received = pgmsg.receive_many("test.inbox", messages)
        for n in range(50):
            pgmsg.receive("test.inbox", f"single-{n}", type="work", payload={})
        assert _advisory_locks_held() == 0
    assert all(r.stored for r in received)
    assert InboxMessage.objects.filter(message_id__startswith="bulk-").count() == 50_000
    again = pgmsg.receive_many("test.inbox", messages[:10] + [messages[-1]])
    assert not any(r.stored for r in again)


def test_concurrent_batches_that_share_ids_store_each_id_once():
    """Two transactions receive overlapping batches, in opposite orders, at the same time: no
    deadlock (keys are taken in message id order), and each shared id is stored by exactly one."""
    ids = [f"shared-{n}" for n in range(3_000)]
    batches = [ids[:2_000], list(reversed(ids[1_000:]))]
    start = threading.Barrier(2)
    results: dict[int, list] = {}

    def receive(i: int) -> None:
        try:
            start.wait()
            with transaction.atomic():
                results[i] = pgmsg.receive_many(
                    "test.inbox",
                    [{"message_id": m, "type": "work", "payload": {}} for m in batches[i]],
                )
        finally:
            connection.close()

    threads = [threading.Thread(target=receive, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    stored = [r.message_id for i in (0, 1) for r in results[i] if r.stored]
    assert sorted(stored) == sorted(ids)
    assert InboxMessage.objects.filter(message_id__startswith="shared-").count() == 3_000
