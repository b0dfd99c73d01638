"""Outboxes with capture="logical", declared only where a test asks for them.

A relay of a logical outbox fails at start on a server without wal_level = logical (CI's
PostgreSQL 15): declared at import like the others, they would stop every `listen` of the
suite there. test_logical.py declares them in a fixture, and its relay processes get
PGMSG_TEST_LOGICAL=1 (pgmsg_tests/testapp/listeners.py).
"""

from __future__ import annotations

import pgmsg

RECORDED = "test.logical"
NATS = "test.logical-nats"


def declare() -> list[pgmsg.Outbox]:
    return [
        pgmsg.Outbox(RECORDED, destination="recorder", max_attempts=2, capture="logical"),
        pgmsg.Outbox(NATS, destination="jetstream", capture="logical"),
    ]


#: One logical outbox per broker (the benchmark's --capture logical).
PER_BROKER = {
    "amqp": ("test.logical-rabbit", "rabbit"),
    "nats": ("test.logical-jetstream", "jetstream"),
    "redis": ("test.logical-redis", "redis"),
    "mqtt": ("test.logical-mqtt", "mqtt"),
}


def declare_per_broker() -> dict[str, pgmsg.Outbox]:
    return {
        kind: pgmsg.Outbox(name, destination=destination, capture="logical")
        for kind, (name, destination) in PER_BROKER.items()
    }
