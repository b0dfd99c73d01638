"""Bridges from each broker into an inbox, in the test process: what a pgmsg outbox sends
arrives mapped, and bad input (a body that is not JSON, no id, an unknown type, a body too
large, a redelivery) goes through the same path to a dead letter or a skipped duplicate."""

from __future__ import annotations

import io
import json
import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from pgmsg.core.worker import Worker
from pgmsg.inbox.bridges import amqp, mapping, mqtt, nats, redis
from pgmsg.inbox.bridges import checks as bridge_checks
from pgmsg.inbox.bridges import health as bridge_health
from pgmsg.models import InboxBridge, InboxMessage
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.inbox import bridge_brokers
from pgmsg_tests.outbox import brokers
from pgmsg_tests.outbox.proxy import TcpProxy
from pgmsg_tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

KINDS = ["redis", "amqp", "nats", "mqtt"]
CONSUMERS = {
    "redis": redis.RedisConsumer,
    "amqp": amqp.AmqpConsumer,
    "nats": nats.NatsConsumer,
    "mqtt": mqtt.MqttConsumer,
}
INBOX = "test.bridged"


@pytest.fixture(params=KINDS)
def place(request):
    found = bridge_brokers.Place(request.param)
    yield found
    found.close()


class Running:
    """A worker serving bridge ``b`` (and the inbox, when asked) in a thread of this process."""

    def __init__(
        self, settings, place, *, inbox: bool = False, port: int | None = None, **extra
    ) -> None:
        settings.PGMSG = {
            **settings.PGMSG,
            "INBOX_BRIDGES": {"b": place.bridge(INBOX, port=port, **extra)},
        }
        self.worker = Worker(
            bridges=["b"], inboxes=[INBOX] if inbox else None, install_signal_handlers=False
        )
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if port is None:
            self.wait_connected()

    def wait_connected(self) -> None:
        wait_for(
            lambda: self.errors or InboxBridge.objects.filter(name="b", connected=True).exists(),
            message="the bridge connects",
        )
        assert not self.errors, self.errors

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:  # the test fails on it below
            self.errors.append(exc)
        finally:
            connections.close_all()

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(30)
        assert not self.errors, self.errors


def stored(count: int) -> list[InboxMessage]:
    return wait_for(
        lambda: (
            list(InboxMessage.objects.filter(inbox=INBOX).order_by("id"))
            if InboxMessage.objects.filter(inbox=INBOX).count() >= count
            else None
        ),
        message=f"{count} message(s) in the inbox",
    )


def pgmsg_headers(message_id: str, type_: str = "tick", key: str | None = "k1") -> dict:
    found = {"pgmsg-message-id": message_id, "pgmsg-type": type_, "pgmsg-outbox": "a"}
    if key:
        found["pgmsg-key"] = key
    return found


def test_a_pgmsg_message_is_stored_with_its_id_type_and_key(settings, place):
    running = Running(settings, place, inbox=True)
    try:
        place.send(b'{"n": 1}', pgmsg_headers("m-1", key="order-7"))
        (row,) = stored(1)
        assert (row.message_id, row.type, row.aggregate_id) == ("m-1", "tick", "order-7")
        assert row.payload == {"n": 1} and row.source == "bridge:b"
        wait_for(lambda: Effect.objects.filter(key="m-1").exists(), message="handled")
    finally:
        running.stop()


def test_bad_input_becomes_dead_letters_and_the_rest_passes(settings, place):
    """Each bad message is a dead letter with its reason and raw body; the good ones around
    them are stored; nothing is left unacknowledged in the broker."""
    running = Running(settings, place, max_bytes=200)
    try:
        place.send(b'{"n": 0}', pgmsg_headers("ok-0"))
        place.send(b"not json {", pgmsg_headers("bad-json"))
        place.send(b'{"n": 2}', {"some": "header"})
        place.send(b'{"n": 3}', pgmsg_headers("unknown-type", type_="no.such.type"))
        place.send(json.dumps({"n": 4, "pad": "x" * 500}).encode(), pgmsg_headers("big"))
        # JSON that PostgreSQL's jsonb refuses, and a NUL that text refuses: each its own dead
        # letter, never a batch that fails to store again and again.
        place.send(b'{"n": NaN}', pgmsg_headers("nan"))
        place.send(b'{"n": "a\\u0000b"}', pgmsg_headers("nul-escape"))
        place.send(b"nul \x00 byte {", pgmsg_headers("nul-byte"))
        place.send(b'{"n": 5, "text": "a\\\\u0000"}', pgmsg_headers("ok-5"))
        rows = stored(9)
    finally:
        running.stop()
    by_id = {r.message_id: r for r in rows}
    assert by_id["ok-0"].status == by_id["ok-5"].status == "pending"
    assert by_id["unknown-type"].type == "no.such.type"  # the inbox's usual handling
    assert by_id["unknown-type"].status == "pending"
    bad_json = by_id["bad-json"]
    assert bad_json.status == "dead" and "not JSON" in bad_json.last_error
    assert bad_json.payload["raw_body"] == "not json {" and bad_json.type == mapping.REJECTED_TYPE
    (no_id,) = [r for r in rows if r.message_id.startswith("b:")]
    assert no_id.status == "dead" and "no message id" in no_id.last_error
    assert json.loads(no_id.payload["raw_body"]) == {"n": 2}
    big = by_id["big"]
    assert big.status == "dead" and "max_bytes" in big.last_error
    assert by_id["nan"].status == "dead" and "NaN" in by_id["nan"].last_error
    assert by_id["nul-escape"].status == "dead" and "u0000" in by_id["nul-escape"].last_error
    nul_byte = by_id["nul-byte"]
    assert nul_byte.status == "dead" and nul_byte.payload["raw_body"] == "nul \\x00 byte {"
    # An escaped backslash before "u0000" is no NUL: stored as it came.
    assert by_id["ok-5"].payload == {"n": 5, "text": "a\\u0000"}
    assert big.aggregate_id is None  # a reject holds no ordered aggregate back


def test_a_redelivered_message_is_a_skipped_duplicate(settings, place):
    """A message delivered again after its ack was lost (the broker holds two copies here, as
    after a reconnect) is stored and handled once."""
    running = Running(settings, place, inbox=True)
    try:
        place.send(b'{"n": 1}', pgmsg_headers("twice"))
        stored(1)
        place.send(b'{"n": 1}', pgmsg_headers("twice"))
        place.send(b'{"n": 2}', pgmsg_headers("after"))
        wait_for(lambda: Effect.objects.filter(key="after").exists(), message="handled")
    finally:
        running.stop()
    assert InboxMessage.objects.filter(inbox=INBOX, message_id="twice").count() == 1
    assert Effect.objects.filter(key="twice").count() == 1


def test_a_broker_client_that_fails_its_own_way_fails_the_bridge_not_the_worker(
    settings, place, monkeypatch
):
    """A client error that is not a lost connection (pika's InvalidFrameError, an assertion
    of its own) is the bridge's failure: degraded with the error, reconnected after a
    backoff, nothing lost; the worker keeps running. Before, it ended the worker."""
    consumer_class = CONSUMERS[place.kind]
    fetch, failures = consumer_class.fetch, []

    def fails_once(self, limit):
        if not failures:
            failures.append(limit)
            raise RuntimeError("a frame the client cannot decode")
        return fetch(self, limit)

    monkeypatch.setattr(consumer_class, "fetch", fails_once)
    # port= given: Running does not wait for a connection, which the failure may come before
    running = Running(settings, place, inbox=True, port=brokers.PORTS[place.kind])
    try:
        wait_for(
            lambda: InboxBridge.objects.filter(name="b", error__contains="RuntimeError").exists(),
            message="the bridge reports the client's failure",
        )
        running.wait_connected()  # after its backoff (an MQTT session must exist to queue)
        place.send(b'{"n": 1}', pgmsg_headers("through"))
        wait_for(lambda: Effect.objects.filter(key="through").exists(), message="handled")
        assert running.thread.is_alive() and not running.errors
    finally:
        running.stop()
    assert InboxMessage.objects.filter(inbox=INBOX, message_id="through").count() == 1


def test_a_bridge_that_cannot_reach_its_broker_is_degraded_with_the_brokers_error(
    settings, place, client, django_user_model
):
    """Health in the status command, the JSON endpoint (anonymous: the status only) and the
    admin overview; healthy again once the broker can be reached."""
    proxy = TcpProxy(brokers.PORTS[place.kind])
    proxy.cut()
    running = Running(settings, place, port=proxy.port)
    try:
        wait_for(
            lambda: InboxBridge.objects.filter(name="b").exclude(error="").exists(),
            message="the bridge reports the broker's error",
        )
        (health,) = bridge_health.health()
        assert health.status == "degraded" and not health.connected
        assert "cannot reach the broker" in health.reasons[0] and health.error
        out = io.StringIO()
        with pytest.raises(CommandError):
            call_command("pgmsg_inbox", "status", stdout=out)
        assert "bridge b -> test.bridged" in out.getvalue()
        assert "not connected" in out.getvalue()
        answer = client.get("/pgmsg/inbox/health/")
        assert answer.status_code == 503 and answer.json() == {"status": "degraded"}
        client.force_login(django_user_model.objects.create_superuser("admin", "", "pw"))
        body = client.get("/pgmsg/inbox/health/").json()
        assert body["bridges"]["b"]["connected"] is False and body["bridges"]["b"]["error"]
        page = client.get("/admin/pgmsg/overview/").content.decode()
        assert "Bridges from brokers into inboxes" in page and "cannot reach the broker" in page
        proxy.restore()
        running.wait_connected()
        wait_for(lambda: bridge_health.health()[0].status == "healthy", message="healthy again")
        place.send(b'{"n": 1}', pgmsg_headers("after-outage"))
        stored(1)
        wait_for(lambda: bridge_health.health()[0].last_message_at, message="last message")
        if place.kind != "mqtt":  # MQTT brokers report no lag
            wait_for(lambda: bridge_health.health()[0].lag == 0, message="lag reported")
    finally:
        running.stop()
        proxy.close()


def test_a_producer_that_is_not_pgmsg_is_mapped_by_the_configured_places(settings, place):
    """Id, type, key and trace id from JSON paths of the body and from a header."""
    running = Running(
        settings,
        place,
        message_id="body:event.id",
        type="body:event.kind",
        aggregate_id="body:event.account",
        trace_id="header:X-Trace",
    )
    try:
        body = {"event": {"id": "ev-1", "kind": "tick", "account": 42}}
        place.send(json.dumps(body).encode(), {"X-Trace": "trace-1"})
        (row,) = stored(1)
    finally:
        running.stop()
    assert (row.message_id, row.type, row.aggregate_id, row.trace_id) == (
        "ev-1",
        "tick",
        "42",
        "trace-1",
    )
    assert row.payload == body


@pytest.mark.parametrize(
    ("value", "quoted"),
    [
        ({"url": "kafka://x", "topic": "t", "inbox": INBOX}, "'kafka'"),
        ({"url": "redis://x", "topic": "t"}, "inbox must be"),
        ({"url": "redis://x", "topic": "t", "inbox": INBOX, "type": "somewhere"}, "'somewhere'"),
        ({"url": "redis://x", "topic": "t", "inbox": INBOX, "max_bytes": 0}, "got 0"),
        ({"url": "redis://x", "topic": "t", "inbox": INBOX, "colour": 1}, "'colour'"),
        ({"url": "amqp://x?prefetch=lots", "topic": "t", "inbox": INBOX}, "'lots'"),
    ],
)
def test_a_bad_declaration_is_a_system_check_error_quoting_the_value(settings, value, quoted):
    settings.PGMSG = {**settings.PGMSG, "INBOX_BRIDGES": {"b": value}}
    (error,) = bridge_checks.check_bridges()
    assert error.id == "pgmsg.E601" and quoted in error.msg


def test_a_bridge_into_an_undeclared_inbox_is_a_system_check_error(settings):
    settings.PGMSG = {
        **settings.PGMSG,
        "INBOX_BRIDGES": {"b": {"url": "redis://x", "topic": "t", "inbox": "no.such.inbox"}},
    }
    (error,) = bridge_checks.check_bridges()
    assert error.id == "pgmsg.E602" and "'no.such.inbox'" in error.msg
