"""The listen worker as real processes when things go wrong: handlers that kill their process,
frozen workers, Ctrl-C, repeated outages, idle workers next to busy ones."""

import os
import signal
import threading
import time

import psutil
import psycopg
import pytest
from django.db import connection, transaction

import pgmsg
from pgmsg.models import Notification, NotificationDeadLetter
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.helpers import effect_counts, locked_rows
from pgmsg_tests.testapp.channels import Poison, Work
from pgmsg_tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def nothing_pending() -> bool:
    return not Notification.objects.exists()


def test_a_message_that_kills_its_worker_dies_alone_and_its_batch_is_handled_once(workers):
    keys = [f"i{i}" for i in range(30)]
    with transaction.atomic():  # one batch: innocents before and after the poison
        pgmsg.notify_many(Work(key=k) for k in keys[:15])
        pgmsg.notify(Poison(key="poison"))
        pgmsg.notify_many(Work(key=k) for k in keys[15:])
    deaths = 0
    while not nothing_pending():
        proc = workers.start("--batch-size", "50")
        wait_for(
            lambda proc=proc: proc.poll() is not None or nothing_pending(),
            timeout=60,
            message="the worker dies or everything is settled",
        )
        if proc.poll() is not None:
            assert proc.returncode == -signal.SIGKILL, workers.log(proc)
            deaths += 1
        assert deaths <= 3, "the poison must be isolated and made dead after max_attempts"
    # The first death took the whole batch with it (its rows suspects, none charged); the
    # second and third were the poison's alone (Poison has max_attempts=2): the fourth
    # worker made it dead without running it.
    assert deaths == 3
    assert not Notification.objects.exists()
    poison = NotificationDeadLetter.objects.get()
    assert (poison.channel, poison.state) == ("test.poison", "dead")
    assert "worker process died while handling it (2 time(s))" in poison.last_error
    assert not Effect.objects.filter(channel="test.poison").exists()
    counts = effect_counts()
    assert sorted(counts) == sorted(keys)
    assert set(counts.values()) == {1}
    with connection.cursor() as cursor:  # the crash records went with their rows
        cursor.execute(
            "SELECT count(*) FROM pgmsg_claim WHERE ids <> '{}' AND %s = ANY(ids)", [poison.id]
        )
        assert cursor.fetchone()[0] == 0


def test_a_frozen_worker_loses_its_batch_to_another_worker(workers):
    # WORKER_IDLE_TIMEOUT is 3 s in the test settings.
    frozen = workers.start("--batch-size", "50")
    keys = [f"f{i}" for i in range(20)]
    pgmsg.notify_many(Work(key=k, sleep=0.05) for k in keys)
    wait_for(lambda: locked_rows() > 0, timeout=60, message="the first worker holds a batch")
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        workers.start("--batch-size", "50")
        wait_for(nothing_pending, timeout=60, message="another worker takes the frozen batch")
        assert psutil.Process(frozen.pid).status() == psutil.STATUS_STOPPED
        time.sleep(0.5)
        assert sorted(effect_counts()) == sorted(keys)
        assert set(effect_counts().values()) == {1}
    finally:
        os.kill(frozen.pid, signal.SIGCONT)


def test_ctrl_c_on_a_supervised_pool_finishes_the_work_in_hand(workers):
    supervisor = workers.start("--processes", "2", "--batch-size", "50")
    parent = psutil.Process(supervisor.pid)
    wait_for(lambda: len(parent.children()) == 2, timeout=30, message="two children")
    keys = [f"c{i}" for i in range(200)]
    pgmsg.notify_many(Work(key=k, sleep=0.05) for k in keys)
    wait_for(lambda: locked_rows() > 0, timeout=60, message="the pool holds a batch")
    time.sleep(0.3)
    os.killpg(supervisor.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    assert supervisor.wait(timeout=60) == 0
    assert "second signal" not in workers.log(supervisor)
    assert locked_rows() == 0
    handled = sum(effect_counts().values())
    # The batches in hand were finished and committed (50 x 0.05 s each): not dropped.
    assert handled > 0
    assert Notification.objects.count() == len(keys) - handled
    assert set(effect_counts().values()) == {1}


def test_a_sigterm_during_start_up_stops_the_worker_gracefully(workers):
    proc = workers.start(env={"PGMSG_TEST_SLOW_START": "1.5"})
    wait_for(lambda: "slow start" in workers.log(proc), timeout=60, message="worker starting")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, workers.log(proc)  # not killed by the signal (-15)


def terminate_worker_backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
        return cursor.fetchone()[0]


def test_reconnect_backoff_starts_short_again_after_each_recovery(workers):
    proc = workers.start("test.work")
    for outage in range(3):
        key = f"outage{outage}"
        pgmsg.notify(Work(key=key))
        wait_for(lambda key=key: effect_counts()[key] == 1, timeout=60, message="connected")
        assert terminate_worker_backends() >= 2
        wait_for(
            lambda n=outage + 1: workers.log(proc).count("reconnecting in") == n,
            timeout=60,
            message="the worker saw the outage",
        )
    pgmsg.notify(Work(key="after"))
    wait_for(lambda: effect_counts()["after"] == 1, timeout=60, message="reconnected")
    pauses = [
        line.split("reconnecting in ")[1].split("s:")[0]
        for line in workers.log(proc).splitlines()
        if "reconnecting in" in line
    ]
    assert pauses == ["0.5", "0.5", "0.5"]


def transactions() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        return cursor.fetchone()[0]


def client_sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND backend_type = 'client backend'"
        )
        return cursor.fetchone()[0]


def test_an_idle_worker_does_not_spin_while_another_holds_due_rows(workers):
    busy = workers.start("test.work", "--batch-size", "100")
    keys = [f"b{i}" for i in range(100)]
    pgmsg.notify_many(Work(key=k, sleep=0.3) for k in keys)  # one 30 s batch
    wait_for(
        lambda: locked_rows() == len(keys) or busy.poll() is not None,
        timeout=60,
        message="busy worker holds all",
    )
    assert busy.poll() is None, workers.log(busy)
    sessions = client_sessions()
    workers.start("test.work")
    wait_for(lambda: client_sessions() == sessions + 2, timeout=60, message="idle worker runs")
    time.sleep(1.0)
    before = transactions()
    time.sleep(2.5)  # statistics reach pg_stat_database about once a second per backend
    during = transactions() - before
    assert locked_rows() == len(keys), "the busy worker must still hold its batch"
    # Idle: a claim and a due check per sweep (1 s in the tests). Spinning: thousands.
    assert during < 100, f"{during} transactions in 2.5 s while idle"
    assert busy.poll() is None


def test_rows_of_a_channel_nobody_declares_are_reported_not_dropped(workers):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgmsg_notification (channel, payload) "
            "SELECT 'test.nobody', '{}' FROM generate_series(1, 3)"
        )
    proc = workers.start()
    wait_for(
        lambda: "3 pending notification(s) on channel 'test.nobody'" in workers.log(proc),
        timeout=60,
        message="the worker names the undeclared channel",
    )
    assert Notification.objects.filter(channel="test.nobody").count() == 3


# Waits for the row lock of the worker's batch, then, in a new snapshot a few microseconds
# after that transaction ended, counts the crash records that name the row.
WAIT_THEN_COUNT_CRASH_RECORDS = """
CREATE FUNCTION pg_temp.crash_records_when_unlocked(row_id bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM pgmsg_notification WHERE id = row_id FOR UPDATE;
    RETURN (SELECT count(*) FROM pgmsg_claim
            WHERE row_id = ANY(ids)
              AND pg_xact_status(transaction_id::text::xid8) = 'aborted');
END $$
"""


def test_a_fast_path_failure_is_never_taken_for_a_crash(caplog):
    # run_batch's fast path rolls its batch back on purpose when a handler fails. Another
    # worker may claim the rows the moment they are unlocked: by then the batch's crash
    # record must be gone, or that worker counts a crash (an attempt no failure logged).
    pgmsg.notify(Work(key="slow-fail", sleep=1.0, fail_times=1))
    row_id = Notification.objects.get().pk
    seen: dict[str, object] = {}
    watching = threading.Event()

    def other_worker() -> None:
        with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as conn:
            conn.execute(WAIT_THEN_COUNT_CRASH_RECORDS)
            watching.set()
            deadline = time.monotonic() + 30
            # Until the worker's batch holds the row (its crash record is written before its
            # handlers run). Looked up without locking the row, which the claim would skip.
            while time.monotonic() < deadline:
                if conn.execute(
                    "SELECT 1 FROM pgmsg_claim WHERE %s = ANY(ids)", [row_id]
                ).fetchone():
                    seen["waited"] = True
                    break
                time.sleep(0.005)
            seen["crash_records"] = conn.execute(
                "SELECT pg_temp.crash_records_when_unlocked(%s)", [row_id]
            ).fetchone()[0]

    blocker = threading.Thread(target=other_worker)
    blocker.start()
    # The worker holds the row for about two seconds: start it only once the other connection
    # is open and watching, or a slow connect under load misses the whole window.
    assert watching.wait(timeout=60), "the other connection did not open"
    with caplog.at_level("WARNING", logger="pgmsg.worker"):
        pgmsg.Worker(channel_names=["test.work"], until_idle=True).run()
        blocker.join(timeout=60)
        assert seen.get("waited"), "the other connection never saw the worker hold the row"
        assert seen["crash_records"] == 0
        wait_for(
            lambda: (
                pgmsg.Worker(channel_names=["test.work"], until_idle=True).run() is None
                and not Notification.objects.exists()
            ),
            message="the retry is handled",
        )
    # One failed attempt, logged and counted; no crash counted on top of it.
    failures = [r.getMessage() for r in caplog.records if "pgmsg failure" in r.getMessage()]
    assert len(failures) == 1, failures
    assert effect_counts() == {"slow-fail": 1}
