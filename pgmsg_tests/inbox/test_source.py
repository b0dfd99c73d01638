"""The inbox source in one process: handlers, priority, partitions, ordering, failures."""

import psycopg
import pytest
from django.db import connection

import pgmsg
from pgmsg.core import errors, locks
from pgmsg.core.worker import Worker
from pgmsg.inbox import operations as inbox_ops
from pgmsg.inbox import source as source_module
from pgmsg.models import InboxMessage
from pgmsg_dev.devdb import database_url
from pgmsg_tests.inbox.helpers import drain, effects, make_due_now, status_of
from pgmsg_tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


# -- processing ----------------------------------------------------------------------------


def test_handlers_get_the_message_and_commit_with_the_processed_mark():
    pgmsg.receive(
        "test.inbox",
        "h-1",
        type="work",
        payload={"k": [1, "two"]},
        source="svc",
        aggregate_id="a1",
        trace_id="trace",
    )
    assert drain().handled == 1
    effect = Effect.objects.get(key="h-1")
    row = status_of("h-1")
    assert effect.data == {
        "aggregate": "a1",
        "attempts": 0,
        "trace_id": "trace",
        "source": "svc",
        "payload": {"k": [1, "two"]},
        # The receipt time as stored, to the microsecond, aware (USE_TZ).
        "received_at": row.received_at.isoformat(),
    }
    assert row.received_at.tzinfo is not None and row.received_at.microsecond
    assert (row.status, row.attempts) == ("processed", 0) and row.processed_at


def test_without_use_tz_the_receipt_time_is_naive_local_time_as_django_reads_it(settings):
    settings.USE_TZ = False
    settings.TIME_ZONE = "Europe/Paris"
    pgmsg.receive("test.inbox", "tz-1", type="work", payload={})
    assert drain().handled == 1
    with connection.cursor() as cursor:  # Django's own reading of the column, for comparison
        cursor.execute("SELECT received_at FROM pgmsg_inbox_message WHERE message_id = 'tz-1'")
        stored = cursor.fetchone()[0]
    assert stored.tzinfo is None
    assert Effect.objects.get(key="tz-1").data["received_at"] == stored.isoformat()


def versions(*message_ids: str) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT transaction_id::text::bigint FROM pgmsg_inbox_message "
            "WHERE message_id = ANY(%s) ORDER BY message_id",
            [list(message_ids)],
        )
        return [row[0] for row in cursor.fetchall()]


def test_a_message_done_with_carries_the_version_of_the_transaction_that_settled_it():
    # The export takes processed and discarded rows anew by this version: the worker's ack
    # stamps it itself, and the row trigger stamps any other update (a discard, by hand).
    for key in ("v-1", "v-2"):
        pgmsg.receive("test.inbox", key, type="work", payload={})
    received = versions("v-1", "v-2")
    assert drain().handled == 2
    processed = versions("v-1", "v-2")
    assert processed[0] == processed[1] > max(received)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id()::text::bigint")  # autocommit: ended
        before = cursor.fetchone()[0]
        cursor.execute(
            "UPDATE pgmsg_inbox_message SET status = 'discarded', last_error = 'by hand' "
            "WHERE message_id = 'v-2' RETURNING transaction_id::text::bigint"
        )
        assert cursor.fetchone()[0] > before
    assert versions("v-1")[0] == processed[0]


def test_priority_map_lower_first_unmapped_last_then_arrival_order():
    kinds = ["low", "normal", "urgent", "work", "normal", "urgent", "low"]
    for i, kind in enumerate(kinds):
        pgmsg.receive("test.inbox", f"p-{i}", type=kind, payload={})
    drain(batch_size=2)
    order = list(Effect.objects.order_by("id").values_list("key", flat=True))
    # urgent (0), normal (5), then the unmapped types in arrival order
    assert order == ["p-2", "p-5", "p-1", "p-4", "p-0", "p-3", "p-6"]


def test_a_priority_level_of_several_types_keeps_their_arrival_order_across_batches():
    kinds = ["c", "b", "x", "a", "c", "b", "a"]  # x: in no level
    for i, kind in enumerate(kinds):
        pgmsg.receive("test.levels", f"l-{i}", type=kind, payload={})
    drain("test.levels", batch_size=3)
    handled = Effect.objects.filter(channel="inbox:test.levels").order_by("id")
    # level 0 (a, b) in arrival order, then level 1 (c), then the rest
    assert list(handled.values_list("key", flat=True)) == [f"l-{i}" for i in (1, 3, 5, 6, 0, 4, 2)]
    assert InboxMessage.objects.filter(inbox="test.levels", status="pending").count() == 0


def test_a_priority_claim_reads_one_range_of_the_index_per_type_not_every_pending_message():
    from pgmsg.inbox import source

    pgmsg.receive_many(
        "test.levels",
        [{"message_id": f"r-{i}", "type": "abcx"[i % 4], "payload": {}} for i in range(2000)],
    )
    params = {"inbox": "test.levels", "types": ["a", "b"], "limit": 100, "parts": 1, "part": 0}
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgmsg_inbox_message")
        claim = cursor.mogrify(
            source.QUERIES["claim_types"], {**params, "null_aggregate_only": False}
        )
        cursor.execute(f"EXPLAIN {claim}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "inbox_type_id_idx" in plan and "Seq Scan on pgmsg_inbox" not in plan, plan


def test_partitions_split_aggregates_by_a_stable_hash_without_overlap():
    for i in range(40):
        pgmsg.receive("test.inbox", f"s-{i}", type="work", payload={}, aggregate_id=f"agg-{i % 8}")
    drain(partition=(0, 2))
    first = set(effects())
    drain(partition=(1, 2))
    both = effects()
    assert 0 < len(first) < 40
    assert sum(both.values()) == 40 and set(both.values()) == {1}
    # A share is whole aggregates.
    aggregates = dict(InboxMessage.objects.values_list("message_id", "aggregate_id"))
    firsts = {aggregates[k] for k in first}
    assert not firsts & {aggregates[k] for k in set(both) - first}


def test_partitions_of_an_ordered_inbox_take_whole_aggregates_in_order():
    for seq in range(3):
        for a in range(8):
            pgmsg.receive(
                "test.ordered",
                f"po-{a}-{seq}",
                type="step",
                aggregate_id=f"pa-{a}",
                payload={"seq": seq},
            )
    drain("test.ordered", partition=(1, 2))
    first = set(effects("inbox:test.ordered"))
    drain("test.ordered", partition=(0, 2))
    done = effects("inbox:test.ordered")
    assert 0 < len(first) < 24 and len(first) % 3 == 0
    assert sum(done.values()) == 24 and set(done.values()) == {1}
    assert not {k.split(":")[0] for k in first} & {k.split(":")[0] for k in set(done) - first}
    rows = Effect.objects.filter(channel="inbox:test.ordered").order_by("id")
    assert all(r.data["previous_done"] for r in rows)


def test_failures_retry_with_backoff_then_dead_letter_with_the_error_and_count():
    pgmsg.receive("test.inbox", "r-1", type="work", payload={"fail_times": 10})
    drain()
    row = status_of("r-1")
    assert (row.status, row.attempts) == ("pending", 1)
    assert "fails on attempt 1" in row.last_error and row.available_at > row.last_failed_at
    for _ in range(2):
        make_due_now()
        drain()
    row = status_of("r-1")
    assert (row.status, row.attempts) == ("dead", 3)  # test.inbox: max_attempts=3
    assert "fails on attempt 3" in row.last_error
    assert effects() == {}


def test_a_retry_that_succeeds_is_processed_once_with_its_attempts_kept():
    pgmsg.receive("test.inbox", "r-2", type="work", payload={"fail_times": 1})
    drain()
    make_due_now()
    drain()
    row = status_of("r-2")
    assert (row.status, row.attempts) == ("processed", 1)
    assert "fails on attempt 1" in row.last_error
    assert effects() == {"r-2": 1}


def test_an_unknown_type_is_dead_at_once_with_the_reason():
    pgmsg.receive("test.inbox", "u-1", type="no.such.type", payload={})
    pgmsg.receive("test.inbox", "u-2", type="work", payload={})
    drain()
    row = status_of("u-1")
    assert (row.status, row.attempts) == ("dead", 1)
    assert "no handler for message type 'no.such.type'" in row.last_error
    assert effects() == {"u-2": 1}


def test_dead_letters_replay_by_id_and_by_type():
    for i in range(3):
        pgmsg.receive(
            "test.inbox",
            f"d-{i}",
            type="work" if i < 2 else "low",
            payload={"fail_unless_fixed": True},
        )
    for _ in range(3):
        drain()
        make_due_now()
    assert set(InboxMessage.objects.values_list("status", flat=True)) == {"dead"}
    for i in range(3):
        Effect.objects.create(key=f"fixed:d-{i}")
    d0 = status_of("d-0").id
    assert inbox_ops.replay("test.inbox", [d0]) == 1
    drain()
    assert effects() == {"d-0": 1}
    assert inbox_ops.replay("test.inbox", type="low") == 1
    drain()
    assert effects() == {"d-0": 1, "d-2": 1}
    assert status_of("d-1").status == "dead"
    assert status_of("d-2").attempts == 0  # a replay starts the count afresh


def test_discard_keeps_the_reason_and_needs_one():
    pgmsg.receive("test.inbox", "x-1", type="nope", payload={})
    drain()
    with pytest.raises(errors.InvalidMessage, match="reason"):
        inbox_ops.discard("test.inbox", [status_of("x-1").id], reason=" ")
    assert inbox_ops.discard("test.inbox", [status_of("x-1").id], reason="sender bug #12") == 1
    row = status_of("x-1")
    assert (row.status, row.discard_reason) == ("discarded", "sender bug #12")
    assert row.discarded_at is not None


def test_ordered_inbox_a_dead_head_holds_its_aggregate_back_and_is_reported():
    for seq in range(3):
        pgmsg.receive(
            "test.ordered",
            f"a-{seq}",
            type="step",
            aggregate_id="A",
            payload={"seq": seq, "fail_unless_fixed": seq == 0},
        )
        pgmsg.receive(
            "test.ordered", f"b-{seq}", type="step", aggregate_id="B", payload={"seq": seq}
        )
    for _ in range(2):  # max_attempts=2
        drain("test.ordered")
        make_due_now()
    assert effects("inbox:test.ordered") == {"B:0": 1, "B:1": 1, "B:2": 1}
    head = status_of("a-0", "test.ordered")
    assert head.status == "dead"
    [gap] = inbox_ops.gaps("test.ordered")
    assert (gap.aggregate_id, gap.head_id, gap.status, gap.attempts, gap.waiting) == (
        "A",
        head.id,
        "dead",
        2,
        2,
    )
    # The rest stays pending behind it, however often a worker looks.
    drain("test.ordered")
    assert status_of("a-1", "test.ordered").status == "pending"
    # Discarding the head lets the aggregate move on, in order.
    inbox_ops.discard("test.ordered", [head.id], reason="obsolete")
    drain("test.ordered")
    assert effects("inbox:test.ordered") == {"B:0": 1, "B:1": 1, "B:2": 1, "A:1": 1, "A:2": 1}
    assert inbox_ops.gaps("test.ordered") == []


def test_ordered_inbox_a_replayed_head_runs_before_the_messages_behind_it():
    for seq in range(3):
        pgmsg.receive(
            "test.ordered",
            f"c-{seq}",
            type="step",
            aggregate_id="C",
            payload={"seq": seq, "fail_unless_fixed": seq == 0},
        )
    for _ in range(2):
        drain("test.ordered")
        make_due_now()
    Effect.objects.create(key="fixed:c-0")
    inbox_ops.replay("test.ordered", type="step")
    drain("test.ordered")
    keys = list(
        Effect.objects.filter(channel="inbox:test.ordered")
        .order_by("id")
        .values_list("key", flat=True)
    )
    assert keys == ["C:0", "C:1", "C:2"]


def test_ordered_inbox_skips_an_aggregate_another_session_holds():
    for agg in ("held", "free"):
        for seq in range(2):
            pgmsg.receive(
                "test.ordered", f"{agg}-{seq}", type="step", aggregate_id=agg, payload={"seq": seq}
            )
    other = psycopg.connect(database_url(connection.settings_dict), autocommit=True)
    try:
        # What a worker busy with aggregate "held" holds for the length of its transaction.
        other.execute(
            "SELECT pg_advisory_lock(hashtext(%s || 'test.ordered'), hashtext('held'))",
            [locks.INBOX],
        )
        drain("test.ordered")
        assert effects("inbox:test.ordered") == {"free:0": 1, "free:1": 1}
    finally:
        other.close()
    drain("test.ordered")
    assert effects("inbox:test.ordered") == {"free:0": 1, "free:1": 1, "held:0": 1, "held:1": 1}


def test_ordered_inbox_a_head_freed_between_claim_and_sleep_is_looked_at_again_soon():
    """A transaction that holds a head behind the read horizon at the claim, and ends before
    the worker picks its sleep, wakes nobody: the worker must still look again shortly (its
    sweep may be minutes away). A fresh horizon read at that point calls the head free and
    the worker slept until its sweep (RabbitMQ bridge latency p99 of 5 s, bench/bridges.py)."""
    worker = Worker(inboxes=["test.ordered"], install_signal_handlers=False)
    (source,) = worker.sources
    blocker = psycopg.connect(database_url(connection.settings_dict))
    try:
        blocker.execute("SELECT pg_current_xact_id()")  # an open transaction with an id
        pgmsg.receive(
            "test.ordered", "late-0", type="step", aggregate_id="agg-l", payload={"seq": 0}
        )
        assert worker.process(source) == 0  # held back by the horizon
        blocker.commit()  # ends between the claim and the worker's sleep: no wake-up
    finally:
        blocker.close()
    wait = source.seconds_until_due(worker)
    assert wait is not None and wait <= source_module.HORIZON_POLL_FIRST, wait
    assert worker.process(source) == 1
    assert effects("inbox:test.ordered") == {"agg-l:0": 1}


def test_ordered_inbox_messages_without_aggregate_are_processed_too():
    pgmsg.receive("test.ordered", "loose", type="step", payload={"seq": 0})
    drain("test.ordered")
    assert status_of("loose", "test.ordered").status == "processed"


@pytest.mark.parametrize("per_message", [False, True])
def test_a_failing_message_does_not_undo_the_others_of_its_batch(settings, per_message):
    settings.PGMSG = {
        **settings.PGMSG,
        "SAVEPOINT_PER_MESSAGE": per_message,
        "RETRY_BACKOFF": 30.0,
        "RETRY_BACKOFF_MAX": 60.0,
    }
    pgmsg.receive("test.inbox", "f-0", type="work", payload={})
    pgmsg.receive("test.inbox", "f-1", type="work", payload={"fail_times": 1})
    pgmsg.receive("test.inbox", "f-2", type="work", payload={})
    pgmsg.receive(
        "test.ordered", "g-0", type="step", aggregate_id="G", payload={"seq": 0, "fail_times": 1}
    )
    pgmsg.receive("test.ordered", "g-1", type="step", aggregate_id="G", payload={"seq": 1})
    pgmsg.receive("test.ordered", "h-0", type="step", aggregate_id="H", payload={"seq": 0})
    drain("test.inbox", "test.ordered")
    assert effects() == {"f-0": 1, "f-2": 1}
    assert effects("inbox:test.ordered") == {"H:0": 1}  # G:1 waits behind the failed G:0
    assert status_of("f-1").attempts == 1 and status_of("g-1", "test.ordered").attempts == 0
    make_due_now()
    drain("test.inbox", "test.ordered")
    assert effects() == {"f-0": 1, "f-1": 1, "f-2": 1}
    assert effects("inbox:test.ordered") == {"H:0": 1, "G:0": 1, "G:1": 1}


def test_ordered_inbox_with_more_aggregates_than_a_batch_takes_drains_them_all():
    pgmsg.receive_many(
        "test.ordered",
        [
            {
                "message_id": f"many-{i}",
                "type": "step",
                "aggregate_id": f"m{i}",
                "payload": {"seq": 0},
            }
            for i in range(30)
        ],
    )
    drain("test.ordered", batch_size=4)
    assert InboxMessage.objects.filter(status="processed").count() == 30


def test_ordered_inbox_messages_without_aggregate_are_not_starved_by_a_backlog():
    pgmsg.receive_many(
        "test.ordered",
        [
            {"message_id": f"bk-{i}", "type": "step", "aggregate_id": "big", "payload": {"seq": i}}
            for i in range(20)
        ],
    )
    pgmsg.receive("test.ordered", "loose-1", type="step", payload={"seq": 0})
    worker = Worker(inboxes=["test.ordered"], batch_size=4, install_signal_handlers=False)
    worker.process(worker.sources[0])  # one batch: the aggregate fills it
    assert status_of("loose-1", "test.ordered").status == "processed"
