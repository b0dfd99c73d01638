"""The table-mode relay, against the recording callable destination: waves keep per-key order,
a refusal holds back its key only, dead letters carry the error, replay and discard work, and
an unavailable broker costs no attempt."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

import pgmsg
from pgmsg.core import errors
from pgmsg.outbox import operations
from pgmsg.outbox import source as relay_module
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.outbox.helpers import make_due_now, relay, rows
from pgmsg_tests.testapp import outbox_declarations as decl

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("recorder")]


def sent(recorded):
    return [(e.key, e.payload) for e in recorded]


def publish(key, n, **payload):
    return pgmsg.publish("test.recorded", {"n": n, **payload}, type="t", key=key)


def test_confirmed_messages_leave_the_outbox_in_key_order(recorder):
    for n in range(6):
        publish(f"k{n % 2}", n)
    publish(None, 99)
    worker = relay("test.recorded")
    assert worker.handled == 7 and not rows("test.recorded").exists()
    by_key: dict = {}
    for e in recorder:
        by_key.setdefault(e.key, []).append(json.loads(e.payload)["n"])
    assert by_key == {"k0": [0, 2, 4], "k1": [1, 3, 5], None: [99]}
    envelope = recorder[0]
    assert envelope.broker_headers()["pgmsg-redelivery-count"] == "0"
    assert envelope.broker_headers()["pgmsg-type"] == "t"


def test_waves_hold_one_message_per_key_in_flight():
    envelopes = [
        relay_module.Envelope(i, "o", str(i), "d", "t", "t", key, "{}", {}, 0, None)
        for i, key in enumerate(["a", "a", None, "b", "a", None, "b"])
    ]
    waves = relay_module._waves(envelopes)
    assert [[e.id for e in wave] for wave in waves] == [[0, 2, 3, 5], [1, 6], [4]]


def test_a_refused_message_holds_back_its_key_only_then_goes_dead_with_the_error(recorder):
    publish("bad", 1, refuse=99)
    publish("bad", 2)
    publish("good", 3)
    publish("good", 4)
    relay("test.recorded")
    assert [e.key for e in recorder] == ["good", "good"]
    head, behind = rows("test.recorded")
    assert (head.state, head.attempts) == ("retrying", 1)
    assert "recorder refuses" in head.last_error and "ValueError" in head.last_error
    assert behind.state == "pending" and behind.attempts == 0
    for _ in range(2):  # max_attempts=3
        make_due_now("test.recorded")
        relay("test.recorded")
    head.refresh_from_db()
    assert (head.status, head.attempts) == ("dead", 3)
    assert "recorder refuses" in head.last_error
    assert rows("test.recorded").count() == 2  # the dead head still holds its key back
    assert list(operations.dead_letters("test.recorded")) == [head]


def test_a_replayed_dead_letter_is_published_with_its_redelivery_count(recorder):
    publish("k", 1, refuse=1)
    relay("test.recorded")
    make_due_now("test.recorded")
    relay("test.recorded")
    assert [(e.key, e.attempts) for e in recorder] == [("k", 1)]
    assert recorder[0].broker_headers()["pgmsg-redelivery-count"] == "1"

    publish("d", 2, refuse=99)
    for _ in range(3):
        make_due_now("test.recorded")
        relay("test.recorded")
    dead = operations.dead_letters("test.recorded").get()
    publish("d", 3)
    assert operations.replay(outbox="test.recorded") == 1
    relay("test.recorded")  # refused again (attempts start over), the key still held back
    assert rows("test.recorded").filter(key="d").count() == 2
    assert operations.discard([dead.id]) == 1
    relay("test.recorded")
    assert [e.payload for e in recorder if e.key == "d"] == ['{"n": 3}']


def test_an_unavailable_broker_keeps_every_message_and_counts_no_attempt(recorder, tmp_path):
    (tmp_path / "down").touch()
    for n in range(3):
        publish("k", n)
    worker = relay("test.recorded")
    assert worker.handled == 0 and not recorder
    assert [(r.status, r.attempts) for r in rows("test.recorded")] == [("pending", 0)] * 3
    (tmp_path / "down").unlink()
    source = worker.sources[0]
    source._down.clear()  # skip the reconnect backoff (a test must not wait it out)
    relay("test.recorded")
    assert [e.payload for e in recorder] == [f'{{"n": {n}}}' for n in range(3)]


def test_a_destination_missing_from_the_settings_makes_dead_letters_naming_it(recorder):
    publish("k", 1)
    settings = {**decl_settings(), "OUTBOX_DESTINATIONS": {}}
    with override_settings(PGMSG=settings):
        for _ in range(3):
            make_due_now("test.recorded")
            relay("test.recorded")
    row = rows("test.recorded").get()
    assert row.status == "dead" and "no destination named 'recorder'" in row.last_error


def test_health_shows_pending_dead_lag_and_relayed_partitions():
    publish("k", 1, refuse=99)
    (health,) = operations.health(["test.recorded"])
    assert (health.pending, health.dead, health.status) == (1, 0, "degraded")
    assert "no relay holds partition(s) [0]" in health.reasons[0]
    for _ in range(3):
        make_due_now("test.recorded")
        relay("test.recorded")
    (health,) = pgmsg.outbox_health(["test.recorded"])
    assert (health.pending, health.dead, health.relayed_partitions) == (0, 1, ())
    assert health.reasons == ("1 dead",)
    with pytest.raises(errors.UnknownOutbox):
        operations.health(["test.nope"])


def test_the_command_lists_replays_and_discards_dead_letters(capsys):
    publish("k", 1, refuse=99)
    for _ in range(3):
        make_due_now("test.recorded")
        relay("test.recorded")
    dead = rows("test.recorded").get()
    call_command("pgmsg_outbox", "list", "--outbox", "test.recorded")
    out = capsys.readouterr().out
    assert f"{dead.id}\ttest.recorded\t{dead.message_id}" in out and "recorder refuses" in out
    with pytest.raises(CommandError, match="degraded: test.recorded"):
        call_command("pgmsg_outbox", "status", "--outbox", "test.recorded")
    assert "1 dead" in capsys.readouterr().out
    call_command("pgmsg_outbox", "replay", str(dead.id))
    assert "replay: 1 message(s)" in capsys.readouterr().out
    dead.refresh_from_db()
    assert (dead.status, dead.attempts) == ("pending", 0)
    call_command("pgmsg_outbox", "discard", str(dead.id), "--reason", "test")
    assert "discard: 1 message(s)" in capsys.readouterr().out
    assert not rows("test.recorded").exists()
    call_command("pgmsg_outbox", "health", "--outbox", "test.recorded", "--json")
    assert '"status": "healthy"' in capsys.readouterr().out


def test_status_says_so_when_no_outbox_is_declared(monkeypatch, capsys):
    from pgmsg.outbox import declarations

    monkeypatch.setattr(declarations.registry, "outboxes", {})
    call_command("pgmsg_outbox", "status")
    assert "no outbox is declared" in capsys.readouterr().out


def decl_settings():
    from django.conf import settings

    return dict(settings.PGMSG)


def test_forwarded_events_are_published_once_keyed_by_stream(recorder):
    from decimal import Decimal

    from pgmsg.core.worker import Worker
    from pgmsg.events import subscriptions
    from pgmsg_tests.testapp.events_handlers import Deposited

    sub = decl.recorded.forward(pgmsg.Subscription("test.forward", category="outboxfwd"))
    try:
        pgmsg.append("outboxfwd-1", [Deposited(amount=Decimal(n)) for n in range(3)])
        pgmsg.append("outboxfwd-2", [Deposited(amount=Decimal(9))])
        pgmsg.append("otherfwd-1", [Deposited(amount=Decimal(5))])  # another category

        def run() -> None:
            Worker(
                subscriptions=["test.forward"],
                outboxes=["test.recorded"],
                until_idle=True,
                install_signal_handlers=False,
            ).run()

        # A subscription reads an event once no older transaction is in flight anywhere on the
        # server (gap-free reads): on a shared server that can take a moment.
        wait_for(lambda: run() or len(recorder) == 4, message="the events are forwarded")
        run()  # a further run finds nothing new: each event is written once
        assert len(recorder) == 4
        stored = {str(e.message_id): e for e in pgmsg.read_stream("outboxfwd-1")}
        by_key: dict = {}
        for e in recorder:
            by_key.setdefault(e.key, []).append(json.loads(e.payload)["amount"])
        assert by_key == {"outboxfwd-1": ["0", "1", "2"], "outboxfwd-2": ["9"]}
        first = recorder[[e.key for e in recorder].index("outboxfwd-1")]
        assert first.message_id in stored and first.type == "test.deposited"
        assert first.headers["event-stream"] == "outboxfwd-1"
        assert first.headers["event-version"] == "1"
        assert sub is subscriptions.registry.get("test.forward")
    finally:
        subscriptions.registry.subscriptions.pop("test.forward", None)
