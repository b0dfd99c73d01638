"""Metrics: the endpoint of a running `listen --processes 2`, the web view, the throughput
table, and the worker without prometheus_client."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

import pgmsg
from pgmsg.core import instruments
from pgmsg.models import Notification, NotificationDeadLetter, Throughput
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.testapp.channels import Work
from pgmsg_tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} from the endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


WORK = {"kind": "channel", "source": "test.work"}


@pytest.mark.processes
def test_the_endpoint_of_listen_processes_2_counts_what_was_sent(workers):
    port = free_port()
    supervisor = workers.start(
        "--processes", "2", "--batch-size", "10", "--metrics-port", str(port),
        "--metrics-address", "127.0.0.1", "test.work",
    )  # fmt: skip
    wait_for(lambda: _answers(port), message="the metrics endpoint answers")
    pgmsg.notify_many(Work(key=f"ok{i}") for i in range(200))
    pgmsg.notify_many(Work(key=f"once{i}", fail_times=1) for i in range(3))
    pgmsg.notify(Work(key="never", always_fail=True))  # 5 attempts (MAX_ATTEMPTS), then dead

    wait_for(
        lambda: Notification.objects.count() == 0 and NotificationDeadLetter.objects.count() == 1,
        message="every notification handled or dead",
    )
    samples = wait_for(
        lambda: (
            (s := scrape(port))
            and value(s, "pgmsg_messages_handled_total", **WORK) == 203
            and value(s, "pgmsg_messages_dead_lettered_total", **WORK) == 1
            and s
        ),
        message="the counters reach what was sent",
    )
    assert value(samples, "pgmsg_messages_failed_total", **WORK) == 3 + 5
    assert value(samples, "pgmsg_messages_retried_total", **WORK) == 3 + 4
    # Every attempt is one claimed row: 200 + 3 * 2 + 5.
    assert value(samples, "pgmsg_claim_batch_size_sum", source="notifications") == 211
    assert value(samples, "pgmsg_handler_duration_seconds_count", **WORK) >= 211
    # Read from the database at scrape time.
    assert value(samples, "pgmsg_dead_letters", **WORK) == 1
    assert value(samples, "pgmsg_backlog", **WORK) == 0
    # The counts are the sum over both worker processes (the supervisor handles nothing).
    pids = set(Effect.objects.values_list("worker_pid", flat=True))
    assert len(pids) == 2 and supervisor.pid not in pids
    log = workers.log(supervisor)
    dead_lines = [line for line in log.splitlines() if line.startswith("pgmsg dead letter")]
    dead = NotificationDeadLetter.objects.get()
    assert dead_lines == [
        f"pgmsg dead letter: kind=notification id={dead.pk} source=test.work attempt=5 "
        "outcome=dead error='RuntimeError: work never always fails'"
    ], log[-3000:]
    failures = [line for line in log.splitlines() if line.startswith("pgmsg failure:")]
    assert len(failures) == 3 + 4


def _answers(port: int) -> bool:
    try:
        scrape(port)
        return True
    except OSError:
        return False


def test_the_web_view_serves_the_database_gauges(client, settings):
    settings.PGMSG = {**settings.PGMSG, "ENDPOINT_TOKEN": "scraper-token"}
    pgmsg.notify(Work(key="waiting"))
    response = client.get("/pgmsg/metrics/", HTTP_AUTHORIZATION="Bearer scraper-token")
    assert response.status_code == 200
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }
    assert value(samples, "pgmsg_backlog", **WORK) == 1
    assert value(samples, "pgmsg_oldest_pending_age_seconds", **WORK) >= 0


def test_the_throughput_table_counts_what_committed():
    pgmsg.notify_many(Work(key=f"t{i}") for i in range(30))
    pgmsg.notify(Work(key="bad", always_fail=True))
    pgmsg.Worker(channel_names=["test.work"], until_idle=True).run()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sum(handled), sum(failed) FROM pgmsg_throughput "
            "WHERE kind = 'notification' AND source = 'test.work'"
        )
        assert cursor.fetchone() == (30, 1)
    assert Throughput.objects.values("pid").distinct().count() == 1


@pytest.mark.processes
def test_a_running_worker_writes_its_counts_before_it_sleeps(workers):
    """A running worker keeps its counts in memory between writes (about one a second while
    busy, core/throughput.py): going idle must write them, not wait for it to stop."""
    workers.start("test.work")
    pgmsg.notify_many(Work(key=f"r{i}") for i in range(40))
    pgmsg.notify(Work(key="r-bad", always_fail=True))

    def counted():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT coalesce(sum(handled), 0), coalesce(sum(failed), 0) FROM pgmsg_throughput "
                "WHERE kind = 'notification' AND source = 'test.work'"
            )
            return cursor.fetchone()

    wait_for(lambda: counted()[0] == 40, message="the running worker's counts written")
    assert counted()[0] == 40  # no batch counted twice (the failing one was redone)
    assert counted()[1] >= 1


def test_without_prometheus_client_the_instruments_do_nothing(monkeypatch):
    monkeypatch.setattr(instruments, "prometheus_client", None)
    assert not instruments.enabled()
    # What instruments() builds without prometheus_client (the cached real ones stay intact).
    assert instruments.instruments.__wrapped__() == {}
    monkeypatch.setattr(instruments, "instruments", instruments.instruments.__wrapped__)
    pgmsg.notify_many(Work(key=f"n{i}") for i in range(5))
    pgmsg.Worker(channel_names=["test.work"], until_idle=True).run()
    assert Effect.objects.filter(listener="record_work").count() == 5


def test_a_batch_of_durations_lands_in_the_same_buckets_as_one_observe_each():
    """The worker observes a batch's handler durations together (instruments.handler_durations):
    the histogram must read exactly as if each had been observed alone, bucket bounds and
    values past the last bound included."""
    from prometheus_client import CollectorRegistry, Histogram

    bounds = instruments.DURATION_BUCKETS
    values = [0.0, 0.0005, 0.001, 0.0010001, 0.0025, 0.7, 1, 29.9, 30, 31, 1e6] + list(bounds)
    one_by_one, together = CollectorRegistry(), CollectorRegistry()
    single = Histogram("d", "d", ["source"], buckets=bounds, registry=one_by_one)
    batched = Histogram("d", "d", ["source"], buckets=bounds, registry=together)
    for value_ in values:
        single.labels("a").observe(value_)
    instruments._observe_many(batched.labels("a"), values)

    def samples(registry):
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in registry.collect()
            for sample in family.samples
            if not sample.name.endswith("_created")
        }

    assert samples(together) == samples(one_by_one)
    assert samples(together)[("d_count", (("source", "a"),))] == len(values)


def test_overview_reports_a_subscriptions_lag_until_it_has_read_its_events():
    from decimal import Decimal

    from pgmsg.metrics import overview
    from pgmsg_tests.testapp.events_handlers import Deposited

    def ledger():
        return next(
            r for r in overview.overview() if (r.kind, r.name) == ("subscription", "test-ledger")
        )

    pgmsg.append("account-1", [Deposited(amount=Decimal(1)), Deposited(amount=Decimal(2))])
    pgmsg.append("account-2", [Deposited(amount=Decimal(3))])
    pgmsg.append("other-1", [Deposited(amount=Decimal(4))])  # another category
    assert ledger().backlog == 3 and ledger().oldest_pending_age >= 0
    pgmsg.Worker(subscriptions=["test-ledger"], until_idle=True).run()
    after = ledger()
    assert (after.backlog, after.oldest_pending_age, after.handled_last_hour) == (0, 0.0, 3)
