"""Arrival-order claims of an inbox without a priority map: where a claim starts, and what it
takes back that it passed."""

import contextlib

import psycopg
import pytest
from django.db import connection

import pgmsg
from pgmsg.core.worker import Worker
from pgmsg.models import InboxMessage
from pgmsg_dev.devdb import database_url
from pgmsg_tests.inbox.helpers import effects, make_due_now, status_of

pytestmark = pytest.mark.django_db(transaction=True)


def receive_fifo(count: int, **payloads: dict) -> None:
    pgmsg.receive_many(
        "test.fifo",
        [
            {"message_id": f"fifo-{i}", "type": "work", "payload": payloads.get(f"fifo-{i}", {})}
            for i in range(count)
        ],
    )


def fifo_worker() -> Worker:
    worker = Worker(inboxes=["test.fifo"], batch_size=10, install_signal_handlers=False)
    # Its first batch's retention run locks expired weeks' partitions, which would wait on a
    # test's row lock (InboxSource._maybe_run_retention).
    worker.sources[0]._next_retention = float("inf")
    return worker


@contextlib.contextmanager
def locked_by_another_session(message_id: str):
    with psycopg.connect(database_url(connection.settings_dict)) as locker:
        locker.execute(
            "SELECT 1 FROM pgmsg_inbox_message WHERE message_id = %s FOR UPDATE", [message_id]
        )
        yield
        locker.rollback()


def pending_fifo() -> set[str]:
    rows = InboxMessage.objects.filter(inbox="test.fifo", status="pending")
    return set(rows.values_list("message_id", flat=True))


def test_claims_start_past_a_full_batch_and_still_take_what_they_passed(monkeypatch):
    # Acknowledged messages stay in the pending index's head until vacuum; a claim from the
    # start after every batch walked them all. Reading from the start only when a batch comes
    # back short (FROM_START_INTERVAL out of the way here) shows in which batch a message
    # that was locked during the first claim is taken.
    monkeypatch.setattr("pgmsg.inbox.source.FROM_START_INTERVAL", 3600.0)
    receive_fifo(26)
    worker = fifo_worker()
    with locked_by_another_session("fifo-0"):
        assert worker.process(worker.sources[0]) == 10  # fifo-1..10: fifo-0 is locked
    assert worker.process(worker.sources[0]) == 10
    assert pending_fifo() == {"fifo-0", *(f"fifo-{i}" for i in range(21, 26))}
    assert worker.process(worker.sources[0]) == 6  # the 5 past the last batch, then fifo-0
    assert pending_fifo() == set()
    with connection.cursor() as cursor:  # the claim prepared, once, on the worker's connection
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE name ~ '^pgmsg_'")
        (statement,) = [text for (text,) in cursor.fetchall()]
    assert "m.id >= (SELECT $1::bigint)" in statement and "LIMIT 10" in statement
    assert effects("inbox:test.fifo") == {f"fifo-{i}": 1 for i in range(26)}


def test_a_message_that_failed_is_claimed_again_before_the_claims_move_on(monkeypatch):
    monkeypatch.setattr("pgmsg.inbox.source.FROM_START_INTERVAL", 3600.0)
    receive_fifo(20, **{"fifo-2": {"fail_times": 1}})
    worker = fifo_worker()
    worker.process(worker.sources[0])
    assert status_of("fifo-2", "test.fifo").attempts == 1
    make_due_now()  # its retry
    worker.process(worker.sources[0])  # from the start: fifo-2, then fifo-10..18
    assert pending_fifo() == {"fifo-19"}
    assert effects("inbox:test.fifo")["fifo-2"] == 1


def test_claims_read_from_the_start_at_least_every_interval(monkeypatch):
    monkeypatch.setattr("pgmsg.inbox.source.FROM_START_INTERVAL", 0.0)
    receive_fifo(21)
    worker = fifo_worker()
    with locked_by_another_session("fifo-0"):
        assert worker.process(worker.sources[0]) == 10
    worker.process(worker.sources[0])  # the interval is over: from the start, fifo-0 first
    assert pending_fifo() == {"fifo-20"}
