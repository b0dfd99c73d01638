"""A relay whose broker refuses every try (a RabbitMQ exchange that does not exist): the
outbox is degraded with the broker's error as soon as a head keeps failing, the streak is one
log line, and ``declare=1`` makes the relay declare the exchange (the real RabbitMQ)."""

from __future__ import annotations

import logging
import uuid

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from pgmsg.core.worker import Worker
from pgmsg.outbox import destinations, operations
from pgmsg_tests.outbox import brokers
from pgmsg_tests.outbox.helpers import make_due_now, rows

pytestmark = pytest.mark.django_db(transaction=True)

RABBIT = "amqp://guest:guest@127.0.0.1:5672/%2F"


@pytest.fixture
def rabbit_url(settings):
    brokers.require("amqp")
    exchange = f"pgmsg-test-{uuid.uuid4().hex[:12]}"

    def point(**options: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in {"exchange": exchange, **options}.items())
        settings.PGMSG = {
            **settings.PGMSG,
            "OUTBOX_DESTINATIONS": {
                **settings.PGMSG["OUTBOX_DESTINATIONS"],
                "rabbit": f"{RABBIT}?{query}",
            },
        }
        return exchange

    yield point
    destinations.close_all()
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(RABBIT))
    connection.channel().exchange_delete(exchange)
    connection.close()


def test_a_head_refused_on_every_try_degrades_the_outbox_with_the_brokers_error(rabbit_url, caplog):
    exchange = rabbit_url()
    caplog.set_level(logging.DEBUG, logger="pgmsg")
    caplog.set_level(logging.WARNING, logger="pika")
    message = pgmsg_publish()
    worker = Worker(outboxes=["test.patient"], until_idle=True, install_signal_handlers=False)
    worker.run()
    assert rows("test.patient").get().attempts == 1
    (health,) = operations.health(["test.patient"])
    assert health.failing == 0 and health.last_error == ""  # one refusal is not a streak yet
    for _ in range(2):
        make_due_now("test.patient")
        worker.run()
    assert rows("test.patient").get(pk=message.id).attempts == 3
    (health,) = operations.health(["test.patient"])
    assert health.status == operations.DEGRADED and health.failing == 1
    assert f"NOT_FOUND - no exchange '{exchange}'" in health.last_error
    assert any(f"no exchange '{exchange}'" in reason for reason in health.reasons)
    with pytest.raises(CommandError, match="degraded: test.patient"):
        call_command("pgmsg_outbox", "status", "--outbox", "test.patient")
    # The streak is one line; pika's own warning (object reprs) is not logged.
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in warnings] == ["pgmsg.worker"], [r.getMessage() for r in warnings]
    assert "NOT_FOUND" in warnings[0].getMessage()


def test_declare_makes_the_relay_declare_the_exchange(rabbit_url):
    import pika

    exchange = rabbit_url(declare="1", mandatory="0")
    message = pgmsg_publish()
    Worker(outboxes=["test.patient"], until_idle=True, install_signal_handlers=False).run()
    assert not rows("test.patient").filter(pk=message.id).exists()  # confirmed by the broker
    connection = pika.BlockingConnection(pika.URLParameters(RABBIT))
    connection.channel().exchange_declare(exchange, passive=True)  # raises if missing
    connection.close()


def pgmsg_publish():
    import pgmsg

    return pgmsg.publish("test.patient", {"n": 1}, type="t", topic="orders", key="k")


def test_declare_makes_the_relay_create_the_nats_stream(settings):
    brokers.require("nats")
    client = brokers.connect("nats")
    stream = f"PGMSGDECL_{uuid.uuid4().hex[:12]}"
    settings.PGMSG = {
        **settings.PGMSG,
        "OUTBOX_DESTINATIONS": {
            **settings.PGMSG["OUTBOX_DESTINATIONS"],
            "rabbit": f"nats://127.0.0.1:4222?declare=1&stream={stream}",
        },
    }
    try:
        import pgmsg

        message = pgmsg.publish("test.patient", {"n": 1}, type="t", topic=f"{stream}.orders")
        Worker(outboxes=["test.patient"], until_idle=True, install_signal_handlers=False).run()
        assert not rows("test.patient").filter(pk=message.id).exists()
        info = client._run(client.js.stream_info(stream))
        assert info.state.messages == 1
    finally:
        destinations.close_all()
        client._run(client.js.delete_stream(stream))
        client.close()
