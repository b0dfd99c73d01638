"""The HTTP(S) destination against a real HTTP server in the test: signed POSTs, and what each
kind of answer (2xx, 4xx, 5xx, none in time, no server) does to a message."""

from __future__ import annotations

import http
import json
import logging
import time

import pytest
from django.test import override_settings

from pgmsg.core import conf, errors, signatures
from pgmsg.outbox import destinations, operations
from pgmsg.outbox.destinations.base import redact
from pgmsg_tests.http_server import RecordingServer
from pgmsg_tests.outbox.helpers import make_due_now, relay, rows
from pgmsg_tests.testapp.outbox_declarations import webhook

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "outbox-test-secret"


@pytest.fixture
def server():
    found = RecordingServer()
    yield found
    destinations.close_all()
    found.close()


def pointed_at(url: str):
    settings = dict(conf.get().__dict__)
    settings["OUTBOX_DESTINATIONS"] = {**settings["OUTBOX_DESTINATIONS"], "webhook": url}
    return override_settings(PGMSG=settings)


@pytest.mark.parametrize("concurrency", [1, 8])
def test_messages_arrive_signed_with_pgmsgs_headers_in_key_order(server, concurrency):
    with pointed_at(server.url(query=f"concurrency={concurrency}")):
        published = [
            webhook.publish("order.placed", {"n": n}, key=f"key-{n % 3}", headers={"h": "v"})
            for n in range(30)
        ]
        relay(webhook.name, batch_size=7)
    assert not rows(webhook.name).exists()
    assert sorted(p["n"] for p in server.payloads()) == list(range(30))
    for key in range(3):
        numbers = [p["n"] for p in server.payloads() if p["n"] % 3 == key]
        assert numbers == sorted(numbers)
    first = next(r for r in server.requests if json.loads(r["body"]) == {"n": 0})
    headers = first["headers"]
    assert first["path"] == "/hook"
    assert headers["pgmsg-message-id"] == published[0].message_id
    assert headers["pgmsg-type"] == "order.placed"
    assert headers["pgmsg-key"] == "key-0"
    assert headers["pgmsg-outbox"] == webhook.name
    assert headers["h"] == "v"
    assert headers["content-type"] == "application/json"
    signatures.verify(signatures.Scheme(), headers.get, first["body"], [SECRET])


def test_a_4xx_answer_is_a_refusal_retried_then_a_dead_letter(server, caplog):
    server.answer = lambda r: (422, "no such order", 0) if b"bad" in r["body"] else (200, "", 0)
    with pointed_at(server.url(query=f"secret={SECRET}")), caplog.at_level(logging.DEBUG):
        bad = webhook.publish("order.placed", {"bad": 1}, key="k")
        webhook.publish("order.placed", {"n": 2}, key="other")
        for _ in range(2):  # max_attempts=2
            relay(webhook.name)
            make_due_now(webhook.name)
    dead = operations.dead_letters(webhook.name).get()
    assert dead.message_id == bad.message_id and dead.attempts == 2
    # The reason phrase is the server's: "Unprocessable Entity" before Python 3.13, "Content" since.
    phrase = http.HTTPStatus(422).phrase
    assert f"HTTP 422 {phrase}: no such order" in dead.last_error
    assert server.payloads() == [{"n": 2}]
    assert SECRET not in caplog.text and SECRET not in dead.last_error


@pytest.mark.parametrize("status", [500, 503, 429, 408])
def test_a_5xx_429_or_408_answer_keeps_the_message_and_counts_no_attempt(server, status):
    server.answer = lambda r: (status, "busy", 0)
    with pointed_at(server.url()):
        webhook.publish("order.placed", {"n": 1}, key="k")
        relay(webhook.name)
        (row,) = rows(webhook.name)
        assert row.status == "pending" and row.attempts == 0
        server.answer = lambda r: (200, "", 0)
        relay_until_empty()
    assert server.payloads() == [{"n": 1}]


def relay_until_empty() -> None:
    deadline = time.monotonic() + 30
    while rows(webhook.name).exists() and time.monotonic() < deadline:
        relay(webhook.name)  # a relay backs off after an unavailable answer: start another
    assert not rows(webhook.name).exists()


def test_no_answer_in_time_keeps_the_message_and_counts_no_attempt(server):
    server.answer = lambda r: (200, "", 2.0)
    with pointed_at(server.url(query="timeout=0.3")):
        webhook.publish("order.placed", {"n": 1}, key="k")
        relay(webhook.name)
        (row,) = rows(webhook.name)
        assert row.status == "pending" and row.attempts == 0
        server.answer = lambda r: (200, "", 0)
        relay_until_empty()


def test_no_server_keeps_the_message_and_counts_no_attempt(server):
    url = server.url()
    server.close()
    with pointed_at(url):
        webhook.publish("order.placed", {"n": 1}, key="k")
        relay(webhook.name)
    (row,) = rows(webhook.name)
    assert row.status == "pending" and row.attempts == 0


def test_a_connection_the_server_closed_while_idle_is_replaced_without_a_failure():
    server = RecordingServer(idle_timeout=0.1)
    try:
        destination = destinations.make("idle", server.url(query=f"secret={SECRET}"))
        for n in range(3):
            outcome = destination.publish([envelope(n)])
            assert outcome == [None]
            time.sleep(0.3)  # the server drops the kept-alive connection meanwhile
        assert [json.loads(r["body"]) for r in server.requests] == [{"n": 0}, {"n": 1}, {"n": 2}]
        destination.close()
    finally:
        server.close()


def test_a_header_http_cannot_carry_refuses_its_message_only(server):
    destination = destinations.make("h", server.url(query=f"secret={SECRET}"))
    good, bad = envelope(1), envelope(2, headers={"note": "\u2603"})
    outcomes = destination.publish([good, bad])
    assert outcomes[0] is None
    assert isinstance(outcomes[1], errors.MessageRefused) and "latin-1" in str(outcomes[1])
    destination.close()


def test_a_destination_without_a_secret_or_with_a_bad_url_is_refused_at_the_check():
    with pytest.raises(errors.UnknownDestination, match="needs a signing secret"):
        destinations.make("nosecret", "https://example.com/hook")
    with pytest.raises(errors.UnknownDestination, match="concurrency"):
        destinations.make("c", "https://example.com/hook?secret=x&concurrency=0")
    with pytest.raises(errors.UnknownDestination, match=r"\*\*\*"):
        destinations.make("t", f"https://example.com/hook?secret={SECRET}&timeout=-1")


def test_the_secret_never_shows_in_a_redacted_url():
    assert redact(f"https://h/p?a=1&secret={SECRET}") == "https://h/p?a=1&secret=***"
    assert redact("amqp://guest:pw@h/") == "amqp://guest:***@h/"
    assert redact("nats://h:4222") == "nats://h:4222"


def envelope(n: int, headers: dict | None = None):
    import datetime as dt

    from pgmsg.outbox.destinations.base import Envelope

    return Envelope(
        id=n,
        outbox="o",
        message_id=f"m-{n}",
        destination="d",
        topic="t",
        type="order.placed",
        key=None,
        payload=json.dumps({"n": n}),
        headers=headers or {},
        attempts=0,
        created_at=dt.datetime.now(dt.UTC),
    )
