"""Outboxes used by the outbox tests: one per broker, and a recording callable destination.

The recorder appends "pid<TAB>message_id<TAB>key<TAB>attempts" lines to the file named by
PGMSG_TEST_RECORD (one write each, O_APPEND: lines of several processes never interleave).
A payload {"refuse": n} makes it refuse the message while its attempts are below n; the file
named by PGMSG_TEST_UNAVAILABLE, while it exists, makes it answer BrokerUnavailable.
"""

from __future__ import annotations

import json
import os
from decimal import Decimal

import pgmsg
from pgmsg.core import errors

rabbit = pgmsg.Outbox("test.rabbit", destination="rabbit", max_attempts=2)
jetstream = pgmsg.Outbox("test.nats", destination="jetstream", max_attempts=2)
redis_streams = pgmsg.Outbox("test.redis", destination="redis", max_attempts=2)
mqtt = pgmsg.Outbox("test.mqtt", destination="mqtt", max_attempts=2)
recorded = pgmsg.Outbox("test.recorded", destination="recorder", max_attempts=3)
partitioned = pgmsg.Outbox("test.partitioned", destination="recorder", partitions=2)
webhook = pgmsg.Outbox("test.webhook", destination="webhook", max_attempts=2)
#: Refused often before it is dead: a head that keeps failing (test_failing_head.py).
patient = pgmsg.Outbox("test.patient", destination="rabbit", max_attempts=10)

BY_BROKER = {"amqp": rabbit, "nats": jetstream, "redis": redis_streams, "mqtt": mqtt}


@recorded.message("order.placed", topic="orders")
class OrderPlaced:
    order_id: int
    total: Decimal
    note: str | None = None


def record(envelope) -> None:
    flag = os.environ.get("PGMSG_TEST_UNAVAILABLE")
    if flag and os.path.exists(flag):
        raise errors.BrokerUnavailable("the test says the broker is down")
    payload = json.loads(envelope.payload)
    if isinstance(payload, dict) and envelope.attempts < payload.get("refuse", 0):
        raise ValueError(f"recorder refuses {envelope.message_id} (attempt {envelope.attempts})")
    line = "\t".join(
        [str(os.getpid()), envelope.message_id, envelope.key or "", str(envelope.attempts)]
    )
    path = os.environ.get("PGMSG_TEST_RECORD")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    RECORDED.append(envelope)


#: Envelopes the recorder took in this process (in-process tests read it).
RECORDED: list = []


@jetstream.message("tick", topic="pgmsgtest.ticks")
class Tick:
    """A numbered message of one key (the process tests check order per key with it)."""

    key: str
    seq: int
