"""An ordered inbox keeps receipt order when receivers commit out of order (real processes)."""

import json

import psycopg
import pytest
from django.db import connection

import pgmsg
from pgmsg.core import horizon
from pgmsg.models import InboxMessage
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.inbox.test_inbox_processes import listening_workers
from pgmsg_tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

INSERT = (
    "INSERT INTO pgmsg_inbox_message (inbox, message_id, type, payload, aggregate_id) "
    "VALUES ('test.ordered', %s, 'step', %s::jsonb, %s)"
)


def other_session() -> psycopg.Connection:
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(key, None)
    return psycopg.connect(**params)


def status(message_id: str) -> str:
    return InboxMessage.objects.get(inbox="test.ordered", message_id=message_id).status


def test_a_later_message_committed_first_waits_for_the_earlier_one(workers, monkeypatch):
    workers.start("--inbox", "test.ordered")
    wait_for(lambda: listening_workers() == 1, timeout=30, message="worker listening")
    slow = other_session()  # receiver A: stores step 0 of agg-x and keeps its transaction open
    try:
        slow.execute(INSERT, ["x-0", json.dumps({"seq": 0}), "agg-x"])
        # Receiver B stores step 1 of agg-x, and commits first.
        pgmsg.receive("test.ordered", "x-1", type="step", payload={"seq": 1}, aggregate_id="agg-x")
        # A message without aggregate, received after B: once it is handled, the worker has
        # looked at agg-x with B's message visible.
        pgmsg.receive("test.ordered", "free", type="step", payload={"seq": 0})
        wait_for(lambda: status("free") == "processed", timeout=60, message="worker ran")
        assert status("x-1") == "pending", "step 1 must wait for step 0's receipt to settle"
        monkeypatch.setattr(horizon, "BLOCKED_AFTER", 0.0)
        (health,) = pgmsg.inbox_health(["test.ordered"])
        assert health.status == "degraded"
        assert any(
            f"read horizon held back by pid {slow.info.backend_pid}" in reason
            for reason in health.reasons
        ), health.reasons
        slow.commit()
    finally:
        slow.close()
    wait_for(lambda: status("x-1") == "processed", timeout=60, message="both steps handled")
    handled = list(
        Effect.objects.filter(channel="inbox:test.ordered", key__startswith="agg-x")
        .order_by("id")
        .values_list("key", flat=True)
    )
    assert handled == ["agg-x:0", "agg-x:1"]


def test_an_open_transaction_does_not_stall_an_unordered_inbox(workers):
    workers.start("--inbox", "test.inbox")
    wait_for(lambda: listening_workers() == 1, timeout=30, message="worker listening")
    slow = other_session()
    try:
        slow.execute("SELECT pg_current_xact_id()")  # an open transaction with an id
        pgmsg.receive("test.inbox", "u-1", type="work", payload={}, aggregate_id="agg-u")
        wait_for(
            lambda: InboxMessage.objects.get(message_id="u-1").status == "processed",
            timeout=60,
            message="the unordered inbox goes on",
        )
    finally:
        slow.close()
