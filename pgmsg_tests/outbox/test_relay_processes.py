"""The relay as a real process (manage.py listen --outbox): broker outages through a TCP proxy,
SIGKILL mid-publish, and two relays on one outbox."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import defaultdict

import pytest
from django.db import transaction

import pgmsg
from pgmsg.outbox import operations
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.outbox import brokers
from pgmsg_tests.outbox.helpers import rows
from pgmsg_tests.outbox.proxy import TcpProxy
from pgmsg_tests.testapp.outbox_declarations import BY_BROKER

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

PROXIED = {
    "amqp": ("rabbit", "amqp", "guest:guest@", "/%2F"),
    "nats": ("jetstream", "nats", "", ""),
    "redis": ("redis", "redis", "", "/0"),
    "mqtt": ("mqtt", "mqtt", "", ""),
}


def in_key_order(got: list[dict]) -> dict[str, list[int]]:
    """Per key, the numbers in the order they first reached the broker."""
    seen, order = set(), defaultdict(list)
    for m in got:
        if m["message_id"] not in seen:
            seen.add(m["message_id"])
            order[m["key"]].append(m["payload"]["n"])
    return order


def test_a_cut_connection_to_each_broker_loses_nothing(workers, monkeypatch):
    """One relay serves an outbox per broker, each through its own proxy; the proxies are cut
    for 5 s mid-stream: the relay reconnects by itself and every message arrives in key order."""
    brokers.require(*PROXIED)
    clients = {kind: brokers.CLIENTS[kind]() for kind in PROXIED}
    proxies = {kind: TcpProxy(brokers.PORTS[kind]) for kind in PROXIED}
    try:
        urls = {
            name: proxies[kind].url(scheme, auth, path)
            for kind, (name, scheme, auth, path) in PROXIED.items()
        }
        monkeypatch.setenv("PGMSG_TEST_DESTINATIONS", json.dumps(urls))
        topics = {kind: clients[kind].topic() for kind in PROXIED}
        proc = workers.start(*[f"--outbox={BY_BROKER[k].name}" for k in PROXIED])

        def publish(numbers) -> None:
            for n in numbers:
                for kind in PROXIED:
                    BY_BROKER[kind].publish(
                        "order.placed", {"n": n}, topic=topics[kind], key=f"key-{n % 5}"
                    )

        publish(range(0, 30))
        for kind in PROXIED:
            assert len(clients[kind].consume(topics[kind], 30)) >= 30
        for proxy in proxies.values():
            proxy.cut()
        publish(range(30, 60))  # while the brokers cannot be reached
        time.sleep(5)
        for health in operations.health([BY_BROKER[k].name for k in PROXIED]):
            assert health.pending >= 30 and health.oldest_pending_age > 0, health
        for proxy in proxies.values():
            proxy.restore()
        publish(range(60, 90))
        for kind in PROXIED:
            got = clients[kind].consume(topics[kind], 90)
            order = in_key_order(got)
            assert sorted(n for ns in order.values() for n in ns) == list(range(90)), kind
            assert all(ns == sorted(ns) for ns in order.values()), kind
        assert "unavailable, messages kept" in workers.log(proc)
        wait_for(
            lambda: not any(rows(BY_BROKER[k].name).exists() for k in PROXIED),
            message="the relay deletes what the brokers confirmed",
        )
    finally:
        for proxy in proxies.values():
            proxy.close()
        for client in clients.values():
            client.close()


KILL_MESSAGES = int(os.environ.get("PGMSG_OUTBOX_KILL_MESSAGES", "1000"))
KILL_KEYS = 50
KILL_MAX_OTHER = int(os.environ.get("PGMSG_OUTBOX_KILL_MAX", "6"))


def everything(client, topic: str, expected: set[str], timeout: float = 120) -> list:
    """What the broker holds for ``topic`` once every expected message id is among it
    (duplicates included: a queue's consume stops at a count, which duplicates can reach)."""
    deadline, count = time.monotonic() + timeout, len(expected)
    while True:
        got = client.consume(topic, count, timeout=5)
        if {m["message_id"] for m in got} >= expected or time.monotonic() > deadline:
            return got
        count = len(got) + 1


@pytest.mark.parametrize("kind", ["nats", "amqp", "redis", "mqtt"])
def test_a_relay_killed_again_and_again_delivers_every_message_in_order(workers, kind):
    """Each broker: N messages over 50 keys, the relay SIGKILLed at random moments (each time it
    has published something) and restarted: the broker holds every message, in order per key
    (first deliveries; a message confirmed but not yet deleted is published again after the
    kill). JetStream holds each exactly once (Nats-Msg-Id). PGMSG_OUTBOX_KILL_MESSAGES=10000
    runs the issue's size. The other brokers stop killing after KILL_MAX_OTHER kills (the relay
    then finishes): each restart costs a Django start-up, and the suite runs four of these."""
    client = brokers.connect(kind)
    outbox = BY_BROKER[kind].name
    try:
        topic = client.topic()
        with transaction.atomic():
            committed = {
                pgmsg.publish(
                    outbox,
                    {"key": f"key-{n % KILL_KEYS}", "seq": n // KILL_KEYS},
                    type="tick",
                    topic=topic,
                    key=f"key-{n % KILL_KEYS}",
                ).message_id
                for n in range(KILL_MESSAGES)
            }
        kills = 0
        while rows(outbox).exists():
            before = rows(outbox).count()
            # Small batches keep the relay mid-stream long enough to be killed there, even on
            # a quiet machine where a whole backlog drains in a fraction of a second.
            proc = workers.start(f"--outbox={outbox}", "--batch-size=10")
            wait_for(
                lambda proc=proc, before=before: (
                    proc.poll() is not None or rows(outbox).count() < before
                ),
                timeout=60,
                interval=0.01,
                message="the restarted relay publishes",
            )
            if kind != "nats" and kills >= KILL_MAX_OTHER:
                wait_for(lambda: not rows(outbox).exists(), message="the last relay finishes")
                break
            time.sleep(random.uniform(0.0, 0.1))
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
        assert kills >= 2, "the relay should have been killed mid-stream at least twice"
        got = everything(client, topic, committed)
        assert {m["message_id"] for m in got} == committed
        if kind == "nats":
            info = client._run(client.js.stream_info(client.stream_of(topic)))
            assert info.state.messages == KILL_MESSAGES  # exactly once: no duplicate kept
        per_key = defaultdict(list)
        seen: set[str] = set()
        for m in got:
            if m["message_id"] not in seen:
                seen.add(m["message_id"])
                per_key[m["payload"]["key"]].append(m["payload"]["seq"])
        assert len(per_key) == KILL_KEYS
        assert all(seqs == list(range(len(seqs))) for seqs in per_key.values())
    finally:
        client.close()


def test_two_relays_never_publish_a_partition_at_once_and_one_takes_over(
    workers, monkeypatch, tmp_path
):
    record = tmp_path / "record.tsv"
    monkeypatch.setenv("PGMSG_TEST_RECORD", str(record))
    first = workers.start("--outbox=test.partitioned")
    wait_for(
        lambda: operations.health(["test.partitioned"])[0].relayed_partitions == (0, 1),
        message="the first relay holds both partitions",
    )
    second = workers.start("--outbox=test.partitioned")

    def publish(numbers) -> None:
        for n in numbers:
            pgmsg.publish("test.partitioned", {"n": n}, type="t", key=f"key-{n % 10}")

    publish(range(200))
    wait_for(lambda: not rows("test.partitioned").exists(), message="the first relay publishes")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    publish(range(200, 400))
    wait_for(lambda: not rows("test.partitioned").exists(), message="the second one takes over")
    lines = [line.split("\t") for line in record.read_text().splitlines()]
    pids = [int(pid) for pid, *_ in lines]
    assert set(pids) == {first.pid, second.pid}  # one listen process each, no supervisor
    by_pid = defaultdict(list)
    for index, pid in enumerate(pids):
        by_pid[pid].append(index)
    assert len(by_pid) == 2
    (early, late) = sorted(by_pid.values(), key=min)
    assert max(early) < min(late), "the second relay published while the first held the parts"
    delivered = {message_id for _, message_id, _, _ in lines}
    assert len(delivered) == 400
