"""The outbox over weekly partitions: idempotency across them, relays over rows spread across
them, and maintenance that drops a past week only once it holds nothing pending or dead."""

from __future__ import annotations

import datetime as dt
import json
import threading
from decimal import Decimal
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

import pgmsg
from pgmsg.core import partitions
from pgmsg.models import OutboxMessage
from pgmsg.outbox import operations
from pgmsg.outbox import partitions as outbox_partitions
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.helpers import waiting_for_a_lock
from pgmsg_tests.outbox.helpers import relay, rows
from pgmsg_tests.testapp import outbox_declarations as decl

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("recorder")]

TABLE = "pgmsg_outbox_message"
OUTBOX = "test.recorded"


def _week(offset: int) -> tuple[str, dt.datetime]:
    """The week partition ``offset`` weeks from this one (made if missing) and its start."""
    start = partitions.week_start(dt.datetime.now(dt.UTC)) + offset * partitions.WEEK
    name = partitions.week_name(TABLE, start)
    with transaction.atomic(), connection.cursor() as cursor:
        if name not in _partition_names():
            partitions.create(cursor, TABLE, name, start, start + partitions.WEEK)
    return name, start


def _partition_names() -> set[str]:
    with connection.cursor() as cursor:
        return {p.name for p in partitions.partitions(cursor, TABLE)}


def _partition_of(message_id: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT tableoid::regclass::text FROM {TABLE} WHERE message_id = %s", [message_id]
        )
        return [row[0] for row in cursor.fetchall()]


def _publish(message_id: str, *, key: str | None = None, n: int = 0) -> pgmsg.Published:
    return pgmsg.publish(OUTBOX, {"n": n}, type="t", key=key, message_id=message_id)


def _order(n: int) -> decl.OrderPlaced:
    return decl.OrderPlaced(order_id=n, total=Decimal(n))


def _move(message_id: str, created_at: dt.datetime) -> None:
    """Move a row to the partition of ``created_at`` (as if it had been published then)."""
    OutboxMessage.objects.filter(message_id=message_id).update(created_at=created_at)


def _drop_future_weeks() -> None:
    this_week = partitions.week_start(dt.datetime.now(dt.UTC))
    with transaction.atomic(), connection.cursor() as cursor:
        for p in partitions.partitions(cursor, TABLE):
            if not p.is_default and p.lower_time() > this_week:  # type: ignore[operator]
                partitions.drop(cursor, p.name)


def test_a_republished_id_is_skipped_whichever_partition_holds_the_first_copy():
    last_week, start = _week(-1)
    for message_id in ("in-last-week", "in-default", "in-this-week"):
        assert _publish(message_id).stored
    _move("in-last-week", start + dt.timedelta(hours=1))
    _move("in-default", start - dt.timedelta(days=400))
    assert _partition_of("in-last-week") == [last_week]
    assert _partition_of("in-default") == [f"{TABLE}_default"]

    assert not _publish("in-last-week").stored
    assert not _publish("in-this-week").stored
    again = pgmsg.publish_many(
        [
            (_order(1), {"message_id": "in-default"}),
            (_order(2), {"message_id": "fresh"}),
            (_order(3), {"message_id": "fresh"}),  # twice in one batch: stored once
        ]
    )
    assert [(p.message_id, p.stored) for p in again] == [
        ("in-default", False),
        ("fresh", True),
        ("fresh", False),
    ]
    assert rows(OUTBOX).filter(message_id__startswith="in-").count() == 3
    assert rows(OUTBOX).filter(message_id="fresh").count() == 1
    # The same id in another outbox is another message.
    assert pgmsg.publish("test.partitioned", {}, type="t", message_id="in-last-week").stored


def test_a_concurrent_publish_of_an_id_held_in_another_partition_waits_and_skips():
    last_week, start = _week(-1)
    first = psycopg.connect(database_url(connection.settings_dict), autocommit=False)
    try:
        # A producer's open transaction holds the first copy, in last week's partition.
        first.execute(
            f"INSERT INTO {TABLE} (outbox, message_id, destination, topic, type, payload, "
            "created_at) VALUES (%s, 'raced', 'recorder', '', 't', '{}', %s)",
            [OUTBOX, start + dt.timedelta(hours=2)],
        )
        result = {}
        second = threading.Thread(target=lambda: result.update(p=_publish_in_thread("raced")))
        second.start()
        wait_for(waiting_for_a_lock, message="the second publish never waited")
        assert second.is_alive()
        first.commit()
        second.join(timeout=60)
        assert result["p"] is False
    finally:
        first.close()
    assert _partition_of("raced") == [last_week]


def test_a_publish_that_waited_for_a_first_copy_rolled_back_is_stored():
    first = psycopg.connect(database_url(connection.settings_dict), autocommit=False)
    try:
        first.execute(
            f"INSERT INTO {TABLE} (outbox, message_id, destination, topic, type, payload) "
            "VALUES (%s, 'undone', 'recorder', '', 't', '{}')",
            [OUTBOX],
        )
        result = {}
        second = threading.Thread(target=lambda: result.update(p=_publish_in_thread("undone")))
        second.start()
        wait_for(waiting_for_a_lock, message="the second publish never waited")
        first.rollback()
        second.join(timeout=60)
        assert result["p"] is True
    finally:
        first.close()
    assert rows(OUTBOX).filter(message_id="undone").count() == 1


def _publish_in_thread(message_id: str) -> bool:
    try:
        with transaction.atomic():
            return _publish(message_id).stored
    finally:
        connection.close()


def test_a_publish_under_repeatable_read_is_refused_with_the_reason():
    with pytest.raises(DatabaseError, match="READ COMMITTED or SERIALIZABLE"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            _publish("rr")
    assert not rows(OUTBOX).exists()


def test_the_relay_publishes_rows_spread_over_several_partitions_in_key_order(recorder):
    weeks = [_week(-3), _week(-2), _week(-1)]
    # Ids give the key order; created_at only says where a row lives.
    for n in range(12):
        _publish(f"m{n}", key=f"k{n % 3}", n=n)
    places = [start + dt.timedelta(hours=1) for _, start in weeks]
    places.append(weeks[0][1] - dt.timedelta(days=400))  # the default partition
    for n in range(8):
        _move(f"m{n}", places[n % 4])
    spread = {p for n in range(12) for p in _partition_of(f"m{n}")}
    assert len(spread) == 5  # three past weeks, the default one and this week's
    worker = relay(OUTBOX)
    assert worker.handled == 12 and not rows(OUTBOX).exists()
    by_key: dict = {}
    for e in recorder:
        by_key.setdefault(e.key, []).append(json.loads(e.payload)["n"])
    assert by_key == {f"k{k}": list(range(k, 12, 3)) for k in range(3)}
    # The past weeks hold nothing now: maintenance drops them (their deleted rows with them).
    dropped = outbox_partitions.drop_emptied()
    assert {name for name, _ in weeks} <= set(dropped)
    assert f"{TABLE}_default" in _partition_names()


def test_maintenance_keeps_a_past_week_while_it_holds_a_pending_or_dead_message(recorder):
    pending_week, pending_start = _week(-3)
    dead_week, dead_start = _week(-2)
    emptied_week, emptied_start = _week(-1)
    _publish("stuck", key="a")
    _publish("failing", key="b")
    _publish("relayed", key="c")
    _move("stuck", pending_start + dt.timedelta(days=1))
    _move("failing", dead_start + dt.timedelta(days=1))
    _move("relayed", emptied_start + dt.timedelta(days=1))
    OutboxMessage.objects.filter(message_id="failing").update(
        status="dead", attempts=3, last_error="refused"
    )
    # "stuck" is pending but not due yet: the relay leaves it, "relayed" goes.
    OutboxMessage.objects.filter(message_id="stuck").update(
        available_at=dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    )
    relay(OUTBOX)
    assert set(rows(OUTBOX).values_list("message_id", flat=True)) == {"stuck", "failing"}

    assert outbox_partitions.drop_emptied() == [emptied_week]
    assert {pending_week, dead_week} <= _partition_names()
    assert emptied_week not in _partition_names()

    # Once the dead letter is replayed and relayed and the pending one discarded, both go.
    operations.replay(rows(OUTBOX).filter(message_id="failing").values_list("id", flat=True))
    relay(OUTBOX)
    assert set(rows(OUTBOX).values_list("message_id", flat=True)) == {"stuck"}
    assert outbox_partitions.drop_emptied() == [dead_week]
    operations.discard(rows(OUTBOX).values_list("id", flat=True))
    assert outbox_partitions.drop_emptied() == [pending_week]
    assert [e.message_id for e in recorder] == ["relayed", "failing"]


def test_a_row_parked_into_a_past_week_while_the_drop_waits_for_its_lock_stays(monkeypatch):
    """A logical relay parks a refused message with its own created_at, so a past week can get
    a row until the drop holds the lock: the partition is checked again under it."""
    name, start = _week(-2)
    monkeypatch.setitem(partitions.QUERIES, "lock_timeout", "SET LOCAL lock_timeout = '120s'")
    parker = psycopg.connect(database_url(connection.settings_dict), autocommit=False)
    try:
        parker.execute(
            f"INSERT INTO {TABLE} (outbox, message_id, destination, topic, type, payload, "
            "status, attempts, created_at) "
            "VALUES (%s, 'parked', 'recorder', '', 't', '{}', 'dead', 1, %s)",
            [OUTBOX, start + dt.timedelta(days=1)],
        )
        result = {}

        def drop():
            try:
                result["dropped"] = outbox_partitions.drop_emptied()
            finally:
                connection.close()

        dropper = threading.Thread(target=drop)
        dropper.start()
        wait_for(_waiting_on_table_lock, message="the drop never waited for the table's lock")
        parker.commit()
        dropper.join(timeout=120)
    finally:
        parker.close()
    assert name not in result["dropped"]
    assert _partition_of("parked") == [name]


def _waiting_on_table_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'relation' AND NOT granted "
            "AND relation = %s::regclass)",
            [TABLE],
        )
        return cursor.fetchone()[0]


def test_pgmsg_partitions_makes_the_weeks_ahead_drops_the_emptied_ones_and_lists_them():
    _drop_future_weeks()
    emptied, _ = _week(-2)
    out = StringIO()
    call_command("pgmsg_partitions", stdout=out)
    this_week = partitions.week_start(dt.datetime.now(dt.UTC))
    ahead = [partitions.week_name(TABLE, this_week + n * partitions.WEEK) for n in (1, 2)]
    assert set(ahead) <= _partition_names()
    assert emptied not in _partition_names()
    text = out.getvalue()
    assert f"dropped {emptied}" in text
    for name in ahead:
        assert f"created {name}" in text
        assert f"{TABLE}  {name}  [" in text


@pytest.mark.processes
def test_a_running_relay_keeps_publishing_while_partitions_are_made_and_dropped(
    workers, monkeypatch, tmp_path
):
    record = tmp_path / "record"
    monkeypatch.setenv("PGMSG_TEST_RECORD", str(record))
    _drop_future_weeks()
    workers.start(f"--outbox={OUTBOX}", "--batch-size", "10")
    # The relay's own pass made the weeks ahead at its start.
    this_week = partitions.week_start(dt.datetime.now(dt.UTC))
    ahead = partitions.week_name(TABLE, this_week + 2 * partitions.WEEK)
    wait_for(lambda: ahead in _partition_names(), message="the relay made no week ahead")
    old, start = _week(-2)
    for n in range(60):
        with transaction.atomic():
            _publish(f"live-{n}", key=f"k{n % 4}", n=n)
            if n == 20:
                _move(f"live-{n}", start + dt.timedelta(hours=1))  # into a past week
        if n == 30:
            _drop_future_weeks()
            call_command("pgmsg_partitions", stdout=StringIO())  # made again under the relay
    wait_for(lambda: not rows(OUTBOX).exists(), message="the relay stopped publishing")
    by_key: dict = {}
    for line in record.read_text().splitlines():
        _, message_id, key, _ = line.split("\t")
        by_key.setdefault(key, []).append(int(message_id.removeprefix("live-")))
    assert by_key == {f"k{k}": list(range(k, 60, 4)) for k in range(4)}
    # The past week's row was relayed: the week goes (pgmsg_partitions may have dropped it
    # already; a drop that did not get its lock in time is tried again), under the relay.
    wait_for(
        lambda: old not in _partition_names() or bool(outbox_partitions.drop_emptied()) and False,
        message="the emptied past week was never dropped",
    )
    _publish("after", key="k0", n=60)
    wait_for(lambda: not rows(OUTBOX).exists(), message="the relay stopped after the drop")


def test_concurrent_batches_that_share_ids_store_each_id_once():
    """Two transactions publish overlapping batches, in opposite orders, at the same time: no
    deadlock (keys are taken in message id order), and each shared id is stored by exactly one."""
    ids = [f"shared-{n}" for n in range(3_000)]
    batches = [ids[:2_000], list(reversed(ids[1_000:]))]
    start = threading.Barrier(2)
    results: dict[int, list] = {}

    def publish(i: int) -> None:
        try:
            start.wait()
            with transaction.atomic():
                results[i] = pgmsg.publish_many(
                    (_order(n), {"message_id": m}) for n, m in enumerate(batches[i])
                )
        finally:
            connection.close()

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    stored = [p.message_id for i in (0, 1) for p in results[i] if p.stored]
    assert sorted(stored) == sorted(ids)
    assert rows(OUTBOX).filter(message_id__startswith="shared-").count() == 3_000
    # Each batch's rows got their ids in the batch's order.
    for i in (0, 1):
        got = [p.id for p in results[i] if p.stored]
        assert got == sorted(got)
