"""A bridge that fetches its next batch while it stores one (Redis Streams, prefetch.py), on a
real Redis: a batch fetched ahead and dropped is delivered again, once, in stream order, and
what was stored is acknowledged."""

from __future__ import annotations

import pytest

from pgmsg.inbox.bridges import brokers, declarations, mapping
from pgmsg.inbox.bridges.prefetch import Batches
from pgmsg.inbox.bridges.redis import RedisConsumer
from pgmsg_tests.inbox import bridge_brokers

INBOX = "test.bridged"
BATCH = 100


@pytest.fixture
def place():
    found = bridge_brokers.Place("redis")
    yield found
    found.close()


@pytest.fixture
def bridge(settings, place):
    settings.PGMSG = {**settings.PGMSG, "INBOX_BRIDGES": {"b": place.bridge(INBOX)}}
    return declarations.get("b")


def batches_of(bridge) -> Batches:
    return Batches(RedisConsumer(bridge), lambda d: mapping.convert(bridge, d), "test-prefetch")


def ids(batch) -> list[str]:
    return [found["message_id"] for _, found in batch]


def send(place, count: int) -> list[str]:
    sent = [f"m{i:04d}" for i in range(count)]
    for message_id in sent:
        place.send(b'{"n": 1}', {"pgmsg-message-id": message_id, "pgmsg-type": "tick"})
    return sent


def test_a_full_batch_fetches_the_next_one_ahead(bridge, place):
    sent = send(place, 250)
    batches = batches_of(bridge)
    try:
        first = batches.take(BATCH)
        assert batches._next is not None  # a full batch: the next one is on its way
        second = batches.take(BATCH)
        third = batches.take(BATCH)
        assert batches._next is None  # 50 of 100: caught up, the next fetch waits for a poll
    finally:
        batches.close()
    assert ids(first) + ids(second) + ids(third) == sent


def test_a_batch_fetched_ahead_and_dropped_is_delivered_again_once_in_order(bridge, place):
    """Close while a batch is fetched ahead and before anything is acknowledged: the next
    consumer reads the pending entries (from the first, then after the last one read, not from
    the first again) and then the new ones: each entry once, in stream order."""
    sent = send(place, 250)
    batches = batches_of(bridge)
    first = batches.take(BATCH)
    ahead = batches._next
    ahead.result(timeout=30)  # the second batch is taken from the stream: pending, not acked
    batches.close()
    assert ids(first) == sent[:BATCH]
    assert place.client.xpending(place.topic, "pgmsg-b")["pending"] == 2 * BATCH

    again = batches_of(bridge)
    seen: list[str] = []
    try:
        while len(seen) < len(sent):
            batch = again.take(BATCH)
            assert batch, f"nothing more after {len(seen)} of {len(sent)}"
            seen += ids(batch)
            again.ack([delivery for delivery, _ in batch])
        assert again.take(BATCH) == []
    finally:
        again.close()
    assert seen == sent
    assert place.client.xpending(place.topic, "pgmsg-b")["pending"] == 0


def test_acknowledgements_sent_on_the_fetching_thread_all_arrive(bridge, place):
    sent = send(place, 1000)
    batches = batches_of(bridge)
    seen: list[str] = []
    try:
        while len(seen) < len(sent):
            batch = batches.take(BATCH)
            seen += ids(batch)
            batches.ack([delivery for delivery, _ in batch])
        assert batches.take(BATCH) == []  # raises a failed acknowledgement, if any
    finally:
        batches.close()
    assert seen == sent
    assert place.client.xpending(place.topic, "pgmsg-b")["pending"] == 0


@pytest.mark.parametrize("kind", ["redis", "amqp", "nats", "mqtt"])
def test_only_a_client_safe_from_two_threads_is_fetched_ahead(settings, kind):
    """pika's connection is one thread's: an AMQP bridge fetched ahead corrupted its frames
    (InvalidFrameError, then the worker died) when the flag was read from an attribute that
    AmqpConsumer already had for another meaning (its prefetch count)."""
    place = bridge_brokers.Place(kind)
    try:
        settings.PGMSG = {**settings.PGMSG, "INBOX_BRIDGES": {"b": place.bridge(INBOX)}}
        bridge = declarations.get("b")
        consumer = brokers.module(bridge).consumer(bridge)
        batches = Batches(consumer, lambda d: mapping.convert(bridge, d), "test-prefetch")
        try:
            assert (batches._thread is not None) is (kind == "redis")
        finally:
            batches.close()
    finally:
        place.close()
