"""Subscriptions served by real `manage.py listen` processes: competing consumers, SIGKILL
takeover, and a subscriber running while writers commit out of order."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid
from collections import Counter

import pytest
from django.db import connection, connections, transaction

import pgmsg
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.testapp.events_handlers import Step
from pgmsg_tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def start_ready(workers, *args: str):
    """Start a worker and wait until it LISTENs (its first sweep has begun by then)."""
    before = listening()
    proc = workers.start(*args)
    wait_for(lambda: listening() > before, timeout=60, message=f"worker {args} listening")
    return proc


def listening() -> int:
    """Workers' LISTEN connections: their last statement is a LISTEN, or a batch's claim
    record (pgmsg/core/claims.py), which they write too."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND (query LIKE 'LISTEN %%' OR query LIKE '%%pgmsg_claim%%')"
        )
        return cursor.fetchone()[0]


def effects(channel: str) -> list[Effect]:
    return list(Effect.objects.filter(channel=channel).order_by("id"))


def assert_stream_order(handled: list[Effect]) -> None:
    """Each stream's events were handled once each, in version order (Effect ids rise with
    the order of handling)."""
    for stream in {e.listener for e in handled}:
        versions = [e.data["version"] for e in handled if e.listener == stream]
        assert versions == list(range(1, len(versions) + 1)), (stream, versions)


def test_two_consumers_share_partitions_and_keep_each_stream_in_order(workers):
    procs = [start_ready(workers, "--subscription", "test-seq") for _ in range(2)]
    for version in range(10):
        for s in range(8):
            pgmsg.append(f"seq-{s}", Step(n=version, sleep=0.02))
    wait_for(
        lambda: Effect.objects.filter(channel="sub.seq").count() >= 80,
        timeout=180,
        message="80 steps handled",
    )
    handled = effects("sub.seq")
    assert len(handled) == 80 and len({e.key for e in handled}) == 80
    assert_stream_order(handled)
    assert {e.worker_pid for e in handled} == {p.pid for p in procs}, "one worker did it all"


def test_a_partition_held_by_a_killed_worker_is_taken_over_without_loss_or_duplicates(workers):
    baseline = listening()
    first = start_ready(workers, "--subscription", "test-seq", "--batch-size", "5")
    for version in range(12):
        for s in range(3):
            pgmsg.append(f"seq-k{s}", Step(n=version, sleep=0.1))
    wait_for(
        lambda: Effect.objects.filter(channel="sub.seq").count() >= 5,
        timeout=180,
        message="the first worker committed a batch",
    )
    os.killpg(first.pid, signal.SIGKILL)  # mid-batch: its open transaction dies with it
    first.wait()
    # Its sessions end once the server reads the closed sockets; until then they would count
    # as the next worker's (start_ready compares counts).
    wait_for(
        lambda: listening() <= baseline, timeout=60, message="the killed worker's sessions ended"
    )
    killed_at = Effect.objects.filter(channel="sub.seq").count()
    second = start_ready(workers, "--subscription", "test-seq")
    wait_for(
        lambda: Effect.objects.filter(channel="sub.seq").count() >= 36,
        timeout=180,
        message="all 36 steps handled",
    )
    handled = effects("sub.seq")
    assert len(handled) == 36 and len({e.key for e in handled}) == 36  # none lost, none twice
    assert_stream_order(handled)
    pids = Counter(e.worker_pid for e in handled)
    assert pids[first.pid] == killed_at and pids[second.pid] == 36 - killed_at > 0


def test_a_subscriber_sees_every_event_while_writers_commit_out_of_order(workers):
    start_ready(workers, "--subscription", "test-audit")
    appended: list[uuid.UUID] = []
    lock = threading.Lock()

    def write(index: int) -> None:
        rng = random.Random(index)
        try:
            for t in range(10):
                with transaction.atomic():
                    for _ in range(rng.randint(1, 3)):
                        event = Step(n=t)
                        pgmsg.append(f"seq-w{index}x{rng.randint(0, 1)}", event)
                        with lock:
                            appended.append(event.message_id)
                        time.sleep(rng.uniform(0, 0.04))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wait_for(
        lambda: Effect.objects.filter(channel="sub.audit").count() >= len(appended),
        timeout=180,
        message=f"{len(appended)} events handled",
    )
    time.sleep(1.5)  # a sweep interval: late duplicates would show up now
    handled = effects("sub.audit")
    assert Counter(uuid.UUID(e.key) for e in handled) == Counter(appended)  # each exactly once
    assert_stream_order(handled)
    # The writers' commits did arrive out of position order.
    positions = [e.data["position"] for e in handled]
    assert positions != sorted(positions), "no out-of-order commit happened: test is void"


def test_an_event_whose_handler_kills_its_worker_stops_its_partition_after_max_attempts(workers):
    """The poison is counted through pgmsg_claim (its batch's transaction dies with the
    process), isolated from the events of its batch, and its partition stopped at it after
    max_attempts (test-crash: 2): nothing after it is skipped, nothing before it runs twice."""
    from pgmsg.events import subscription_operations as operations
    from pgmsg.models import SubscriptionPartition

    for n in range(10):
        pgmsg.append("crash-1", Step(n=n, tag="die" if n == 4 else ""))

    def stopped() -> bool:
        return SubscriptionPartition.objects.filter(
            subscription="test-crash", status="stopped"
        ).exists()

    deaths = 0
    while not stopped():
        proc = workers.start("--subscription", "test-crash", "--batch-size", "50")
        wait_for(
            lambda proc=proc: proc.poll() is not None or stopped(),
            timeout=60,
            message="the worker dies or the partition stops",
        )
        if proc.poll() is not None:
            deaths += 1
        assert deaths <= 3, "the poison must be counted and its partition stopped"
    # Its batch of ten died uncharged (suspects, then run alone), then the poison alone twice.
    assert deaths == 3
    poison = pgmsg.read_stream("crash-1")[4]
    [partition] = SubscriptionPartition.objects.filter(subscription="test-crash")
    assert partition.failed_position == poison.position
    assert "worker process died while handling it (2 time(s))" in partition.last_error
    assert [e.data["n"] for e in effects("sub.crash")] == [0, 1, 2, 3]
    assert operations.skip("test-crash") == 1  # the operator passes over it
    wait_for(
        lambda: Effect.objects.filter(channel="sub.crash").count() >= 9,
        timeout=60,
        message="the events after the poison handled",
    )
    time.sleep(1.5)  # a sweep interval: late duplicates would show up now
    assert [e.data["n"] for e in effects("sub.crash")] == [0, 1, 2, 3, 5, 6, 7, 8, 9]
