"""The inbox under real worker and producer processes: duplicate storms, NOTIFY from raw SQL,
per-aggregate ordering under competing workers, and SIGKILL mid-batch."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import psycopg
import pytest
from django.db import connection

import pgmsg
from pgmsg.models import InboxMessage
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import ROOT, wait_for
from pgmsg_tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def listening_workers() -> int:
    """Worker sessions that have LISTENed (a started worker is ready once it has)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'LISTEN%%'"
        )
        return cursor.fetchone()[0]


def sessions_writing_effects() -> int:
    """Other sessions whose open transaction has inserted into the Effect table: a worker
    that has run at least one handler of its batch and not committed yet."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks AS l "
            "JOIN pg_class AS c ON c.oid = l.relation "
            "WHERE c.relname = 'testapp_effect' AND l.mode = 'RowExclusiveLock' "
            "AND l.pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def effects(channel: str) -> Counter:
    return Counter(Effect.objects.filter(channel=channel).values_list("key", flat=True))


def all_processed(inbox: str, count: int):
    return lambda: InboxMessage.objects.filter(inbox=inbox, status="processed").count() == count


def test_a_duplicate_delivery_storm_is_stored_once_and_processed_once(workers):
    for _ in range(2):
        workers.start("--inbox", "test.inbox", "--batch-size", "20")
    count, producers = 150, 4
    start_at = time.time() + 3.0  # past the producers' Django start-up, so they overlap
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pgmsg_tests.scripts.inbox_producer",
                str(seed),
                str(count),
                str(start_at),
                "single" if seed % 2 else "many",
            ],
            cwd=ROOT,
            env=workers.env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in range(producers)
    ]
    stored = [json.loads(p.communicate(timeout=120)[0])["stored"] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(stored) == count  # each id reported "stored" by exactly one producer
    assert InboxMessage.objects.filter(inbox="test.inbox").count() == count
    wait_for(all_processed("test.inbox", count), timeout=90, message="storm processed")
    time.sleep(1.0)  # a late second processing would show up here
    done = effects("inbox:test.inbox")
    assert sorted(done) == sorted(f"storm-{i}" for i in range(count))
    assert set(done.values()) == {1}


def test_a_raw_sql_insert_wakes_a_running_worker_by_notify(workers):
    # The sweep of these settings is 10 minutes away: only the trigger's NOTIFY can wake it.
    pgmsg.receive("test.inbox", "before-start", type="work", payload={})
    workers.start("--inbox", "test.inbox", "--settings", "pgmsg_tests.testapp.inbox_settings")
    # Handled by the start-up sweep: after this the worker only waits.
    wait_for(
        lambda: effects("inbox:test.inbox") == {"before-start": 1},
        timeout=30,
        message="start-up sweep done",
    )
    with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as producer:
        producer.execute(
            "INSERT INTO pgmsg_inbox_message (inbox, message_id, type, payload) "
            "VALUES ('test.inbox', 'raw-1', 'work', '{\"x\": 1}') ON CONFLICT DO NOTHING"
        )
    wait_for(
        lambda: effects("inbox:test.inbox") == {"before-start": 1, "raw-1": 1},
        timeout=20,
        message="the worker woke for a raw-SQL row",
    )


def test_an_ordered_head_held_only_by_the_horizon_is_handled_when_it_passes(workers):
    """The worker woken for a message that an open transaction of another session holds
    behind the read horizon finds nothing to claim; that transaction's end wakes nobody. It
    must look again by itself, not wait for its sweep (10 minutes away in these settings)."""
    workers.start("--inbox", "test.ordered", "--settings", "pgmsg_tests.testapp.inbox_settings")
    wait_for(lambda: listening_workers() == 1, timeout=30, message="the worker listening")
    with psycopg.connect(database_url(connection.settings_dict)) as blocker:
        blocker.execute("SELECT pg_current_xact_id()")  # an open transaction with an id
        pgmsg.receive(
            "test.ordered", "held-1", type="step", aggregate_id="agg-h", payload={"seq": 0}
        )
        time.sleep(1.0)  # the worker wakes, looks, and finds the head above the horizon
        assert InboxMessage.objects.get(message_id="held-1").status == "pending"
        blocker.commit()
    wait_for(
        all_processed("test.ordered", 1),
        timeout=30,
        message="the held head handled once the horizon passed it",
    )


def test_ordered_aggregates_stay_in_order_under_two_workers_with_random_delays(workers):
    for _ in range(2):
        workers.start("--inbox", "test.ordered", "--batch-size", "3")
    wait_for(lambda: listening_workers() == 2, timeout=30, message="both workers listening")
    aggregates, steps = 8, 12
    for seq in range(steps):  # arrivals interleave the aggregates, while the workers run
        pgmsg.receive_many(
            "test.ordered",
            [
                {
                    "message_id": f"o-{a}-{seq}",
                    "type": "step",
                    "aggregate_id": f"agg-{a}",
                    "payload": {"seq": seq, "sleep_max": 0.02},
                }
                for a in range(aggregates)
            ],
        )
    wait_for(
        all_processed("test.ordered", aggregates * steps),
        timeout=90,
        message="ordered inbox processed",
    )
    rows = list(Effect.objects.filter(channel="inbox:test.ordered").order_by("id"))
    assert len(rows) == aggregates * steps
    assert all(r.data == {"alone": True, "previous_done": True, "already": False} for r in rows), [
        r.data | {"key": r.key}
        for r in rows
        if not r.data["alone"] or not r.data["previous_done"] or r.data["already"]
    ]
    for a in range(aggregates):
        seqs = [int(r.key.split(":")[1]) for r in rows if r.key.startswith(f"agg-{a}:")]
        assert seqs == list(range(steps))
    assert len({r.worker_pid for r in rows}) == 2, "both workers should have taken aggregates"


@pytest.mark.parametrize("inbox", ["test.inbox", "test.ordered"])
def test_a_worker_killed_mid_batch_loses_nothing_and_applies_nothing_twice(workers, inbox):
    first = workers.start("--inbox", inbox, "--batch-size", "50")
    wait_for(lambda: listening_workers() == 1, timeout=30, message="worker listening")
    messages = [
        {
            "message_id": f"k-{i}",
            "type": "step" if inbox == "test.ordered" else "work",
            "aggregate_id": f"agg-{i % 3}",
            "payload": {"seq": i // 3, "sleep": 0.25},
        }
        for i in range(12)
    ]
    pgmsg.receive_many(inbox, messages)
    # Mid-batch: the worker has run handlers whose effects it has not committed.
    wait_for(lambda: sessions_writing_effects() > 0, timeout=30, message="worker mid-batch")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert InboxMessage.objects.filter(inbox=inbox, status="processed").count() == 0
    assert not Effect.objects.exists()
    second = workers.start("--inbox", inbox, "--batch-size", "50")
    wait_for(all_processed(inbox, 12), timeout=60, message="second worker finishes")
    time.sleep(0.5)
    channel = f"inbox:{inbox}"
    expected = [f"agg-{i % 3}:{i // 3}" if inbox == "test.ordered" else f"k-{i}" for i in range(12)]
    done = effects(channel)
    assert sorted(done) == sorted(expected) and set(done.values()) == {1}
    assert set(Effect.objects.values_list("worker_pid", flat=True)) == {second.pid}
