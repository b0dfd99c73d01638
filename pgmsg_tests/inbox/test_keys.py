"""Receipts of distinct message ids never deadlock, whatever their order; a duplicate still
waits for its first copy's transaction (pgmsg_inbox_key, migration 0033)."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection

import pgmsg
from pgmsg.inbox import retention
from pgmsg.models import InboxMessage
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.helpers import opposite_orders, waiting_for_a_lock

pytestmark = pytest.mark.django_db(transaction=True)

INBOX = "test.inbox"


def _receive(message_id: str) -> None:
    pgmsg.receive(INBOX, message_id, type="work", payload={})


def _receive_many(message_id: str) -> None:
    pgmsg.receive_many(INBOX, [{"message_id": message_id, "type": "work", "payload": {}}])


def _insert(message_id: str) -> None:
    # The plain-SQL path: an INSERT that meets the first-receipt trigger.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgmsg_inbox_message (inbox, message_id, type, payload) "
            "VALUES (%s, %s, 'work', '{}')",
            [INBOX, message_id],
        )


@pytest.mark.parametrize("write", [_receive, _receive_many, _insert], ids=lambda f: f.__name__)
def test_two_transactions_receiving_distinct_ids_in_opposite_orders_never_deadlock(write):
    assert opposite_orders(write, INBOX) == []
    assert InboxMessage.objects.filter(inbox=INBOX).count() == 4


def _second_receipt_after(end: str, message_id: str, batch: bool = False) -> bool:
    """A first copy in an open transaction; a second receipt (receive(), or with ``batch``
    receive_many() between two fresh ids) waits for it; the first ends with ``end``: whether
    the second stored its copy."""
    first = psycopg.connect(database_url(connection.settings_dict), autocommit=False)
    result: dict = {}

    def second() -> None:
        try:
            if not batch:
                result["stored"] = pgmsg.receive(INBOX, message_id, type="work", payload={}).stored
                return
            ids = [f"{message_id}-before", message_id, f"{message_id}-after"]
            received = pgmsg.receive_many(
                INBOX, [{"message_id": i, "type": "work", "payload": {}} for i in ids]
            )
            assert [r.stored for r in received[::2]] == [True, True]
            result["stored"] = received[1].stored
        finally:
            connection.close()

    try:
        first.execute("SELECT pgmsg_receive(%s, %s, 'work', '{}')", [INBOX, message_id])
        thread = threading.Thread(target=second)
        thread.start()
        wait_for(waiting_for_a_lock, message="the second receipt never waited for the first")
        assert thread.is_alive()
        getattr(first, end)()
        thread.join(timeout=60)
    finally:
        first.close()
    return result["stored"]


@pytest.mark.parametrize("batch", [False, True], ids=["receive", "receive_many"])
def test_a_concurrent_duplicate_waits_for_the_first_copy_then_skips(batch):
    assert _second_receipt_after("commit", "twice", batch) is False
    assert InboxMessage.objects.filter(message_id="twice").count() == 1


@pytest.mark.parametrize("batch", [False, True], ids=["receive", "receive_many"])
def test_a_receipt_that_waited_for_a_first_copy_rolled_back_is_stored(batch):
    assert _second_receipt_after("rollback", "undone", batch) is True
    assert InboxMessage.objects.filter(message_id="undone").count() == 1


def test_receive_many_stores_new_ids_and_ids_whose_row_is_gone_and_skips_the_rest():
    _receive("stored")
    _receive("deleted")
    InboxMessage.objects.filter(message_id="deleted").delete()  # its key outlives it
    ids = ["new-b", "stored", "deleted", "new-a", "new-b", "new-c"]
    received = pgmsg.receive_many(
        INBOX, [{"message_id": i, "type": "work", "payload": {"n": n}} for n, i in enumerate(ids)]
    )
    assert [r.stored for r in received] == [True, False, True, True, False, True]
    rows = InboxMessage.objects.filter(inbox=INBOX).exclude(message_id="stored").order_by("id")
    # Row ids follow the batch's order; the first copy of a repeated id is the one stored.
    assert [(m.message_id, m.payload["n"]) for m in rows] == [
        ("new-b", 0), ("deleted", 2), ("new-a", 3), ("new-c", 5)
    ]  # fmt: skip
    assert [r.id for r in received if r.stored] == [m.id for m in rows]
    assert _keys() == {"stored", "deleted", "new-a", "new-b", "new-c"}


def _keys() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT message_id FROM pgmsg_inbox_key WHERE inbox = %s", [INBOX])
        return {row[0] for row in cursor.fetchall()}


def test_retention_trims_the_keys_of_deleted_rows_and_a_later_copy_is_a_new_message():
    for message_id in ("kept", "gone"):
        _receive(message_id)
    assert _keys() == {"kept", "gone"}
    InboxMessage.objects.filter(message_id="gone").delete()
    # A key whose row is gone does not stop a new copy, trimmed or not (deduplication lasts
    # as long as the row, docs/inbox.md).
    assert pgmsg.receive(INBOX, "gone", type="work", payload={}).stored
    InboxMessage.objects.filter(message_id="gone").delete()
    retention.trim_keys()
    assert _keys() == {"kept"}
    assert not pgmsg.receive(INBOX, "kept", type="work", payload={}).stored
    assert pgmsg.receive(INBOX, "gone", type="work", payload={}).stored
    assert _keys() == {"kept", "gone"}
