"""The listen worker as real processes: competition, SIGKILL, signals, lost connections."""

import os
import signal
import time

import psutil
import pytest
from django.db import connection

import pgmsg
from pgmsg.models import Notification
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.helpers import effect_counts, locked_rows
from pgmsg_tests.testapp.channels import Shout, Work
from pgmsg_tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def all_handled(total: int):
    return lambda: Notification.objects.count() == 0 and sum(effect_counts().values()) >= total


def assert_each_handled_once(keys):
    counts = effect_counts()
    assert sorted(counts) == sorted(keys)
    assert set(counts.values()) == {1}, {k: n for k, n in counts.items() if n != 1}
    assert effect_counts(listener="second_listener") == counts


def test_competing_workers_handle_each_notification_exactly_once(workers):
    for _ in range(3):
        workers.start("--batch-size", "50")
    keys = [f"c{i}" for i in range(3000)]
    for start in range(0, len(keys), 500):
        pgmsg.notify_many(Work(key=k) for k in keys[start : start + 500])
    wait_for(all_handled(len(keys)), timeout=120, message="3000 notifications handled")
    time.sleep(1.5)  # a late duplicate would show up here
    assert_each_handled_once(keys)
    pids = set(Effect.objects.values_list("worker_pid", flat=True))
    assert len(pids) >= 2, "the work should have been shared between the workers"


def test_a_worker_killed_mid_batch_loses_nothing_and_applies_nothing_twice(workers):
    first = workers.start("--batch-size", "20")
    keys = [f"k{i}" for i in range(120)]
    pgmsg.notify_many(Work(key=k, sleep=0.02) for k in keys)
    # Mid-batch: one batch has committed and the next one holds its claims.
    wait_for(
        lambda: Effect.objects.exists() and locked_rows() > 0,
        timeout=60,
        message="first worker mid-batch",
    )
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    handled_before = set(effect_counts())
    assert 0 < len(handled_before) < len(keys)
    workers.start("--batch-size", "20")
    wait_for(all_handled(len(keys)), timeout=120, message="second worker finishes")
    time.sleep(1.0)
    assert_each_handled_once(keys)
    assert Effect.objects.values("worker_pid").distinct().count() == 2


def test_sigterm_finishes_the_message_in_hand_commits_and_exits(workers):
    proc = workers.start("--batch-size", "50")
    keys = [f"t{i}" for i in range(100)]
    pgmsg.notify_many(Work(key=k, sleep=0.05) for k in keys)
    wait_for(lambda: locked_rows() > 0, timeout=60, message="worker holds a batch")
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert locked_rows() == 0
    handled = sum(effect_counts().values())
    # Whatever was handled was acknowledged with it, and the rest is still pending.
    assert 0 < handled < len(keys)
    assert Notification.objects.count() == len(keys) - handled
    assert set(effect_counts().values()) == {1}
    workers.start()
    wait_for(all_handled(len(keys)), timeout=60, message="restarted worker finishes")
    assert_each_handled_once(keys)


def test_a_second_signal_exits_at_once_and_the_batch_is_redone(workers, tmp_path):
    proc = workers.start("--batch-size", "50", env={"PGMSG_TEST_LOG_LEVEL": "INFO"})
    keys = [f"s{i}" for i in range(8)]
    # The first message is held until the test lets it go, not slept on for a fixed time: on a
    # loaded machine (CI), a second signal could come after a 2 s sleep had ended, and the
    # worker had committed and exited 0.
    release = tmp_path / "release"
    pgmsg.notify_many(Work(key=k, hold_until=str(release) if k == "s0" else "") for k in keys)
    wait_for(lambda: locked_rows() > 0, timeout=60, message="worker holds a batch")
    proc.send_signal(signal.SIGTERM)
    # Two signals that reach a busy process before its handler runs are one signal.
    wait_for(
        lambda: "finishing the message in hand" in workers.log(proc),
        timeout=30,
        message="the worker took the first signal",
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    wait_for(lambda: locked_rows() == 0, timeout=30, message="server released the claims")
    assert Notification.objects.count() == len(keys)  # nothing acknowledged
    assert effect_counts() == {}  # and no effect kept
    release.touch()
    workers.start()
    wait_for(all_handled(len(keys)), timeout=60, message="restarted worker finishes")
    assert_each_handled_once(keys)


def terminate_other_backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def test_worker_reconnects_after_the_server_drops_its_connections(workers):
    proc = workers.start("--batch-size", "10")
    keys = [f"r{i}" for i in range(60)]
    pgmsg.notify_many(Work(key=k, sleep=0.02) for k in keys[:30])
    wait_for(lambda: locked_rows() > 0, timeout=60, message="worker holds a batch")
    assert terminate_other_backends() >= 2  # its LISTEN and its working connection
    pgmsg.notify_many(Work(key=k) for k in keys[30:])
    wait_for(all_handled(len(keys)), timeout=90, message="worker recovers and finishes")
    assert proc.poll() is None, "the worker must carry on, not exit"
    assert "database error, reconnecting" in workers.log(proc)
    time.sleep(0.5)
    assert_each_handled_once(keys)


def test_rows_whose_notify_was_lost_are_found_by_the_sweep(workers):
    proc = workers.start()
    wait_for(lambda: "LISTEN" in listening_queries(), timeout=30, message="worker listening")
    with connection.cursor() as cursor:
        # Replica mode skips triggers: the row is stored but no NOTIFY is sent.
        cursor.execute("SET session_replication_role = replica")
        cursor.execute(
            "INSERT INTO pgmsg_notification (channel, payload) "
            "VALUES ('test.work', '{\"key\": \"silent\"}')"
        )
        cursor.execute("SET session_replication_role = DEFAULT")
    wait_for(all_handled(1), timeout=30, message="sweep picks the row up")
    assert effect_counts() == {"silent": 1}
    assert proc.poll() is None


def listening_queries() -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT string_agg(query, ' ') FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0] or ""


def test_a_broadcast_reaches_every_listening_process(workers):
    workers.start("test.shout")
    workers.start("test.shout")
    wait_for(
        lambda: listening_queries().count('LISTEN "pgmsg:test.shout"') == 2,
        timeout=30,
        message="both workers listening",
    )
    pgmsg.notify(Shout(text="hello all"))
    wait_for(
        lambda: Effect.objects.filter(channel="test.shout").count() == 2,
        timeout=30,
        message="both workers got the broadcast",
    )
    assert Effect.objects.filter(channel="test.shout").values("worker_pid").distinct().count() == 2


def test_supervisor_restarts_a_crashed_child_and_stops_cleanly(workers):
    supervisor = workers.start("--processes", "2")
    parent = psutil.Process(supervisor.pid)
    wait_for(lambda: len(parent.children()) == 2, timeout=30, message="two children")
    victim = parent.children()[0].pid
    os.kill(victim, signal.SIGKILL)
    wait_for(
        lambda: len(parent.children()) == 2 and victim not in [c.pid for c in parent.children()],
        timeout=30,
        message="child restarted",
    )
    keys = [f"p{i}" for i in range(200)]
    pgmsg.notify_many(Work(key=k) for k in keys)
    wait_for(all_handled(len(keys)), timeout=60, message="restarted pool handles work")
    assert_each_handled_once(keys)
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0
    assert "restarting" in workers.log(supervisor)
