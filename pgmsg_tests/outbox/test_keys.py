"""Publishes of distinct message ids never deadlock, whatever their order; a duplicate still
waits for its first copy's transaction (pgmsg_outbox_key, migration 0033)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.db import connection

import pgmsg
from pgmsg.core import partitions
from pgmsg.outbox import partitions as outbox_partitions
from pgmsg_tests.helpers import opposite_orders
from pgmsg_tests.outbox.helpers import rows
from pgmsg_tests.testapp import outbox_declarations as decl

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("recorder")]

OUTBOX = "test.recorded"


def _publish(message_id: str) -> None:
    pgmsg.publish(OUTBOX, {}, type="t", message_id=message_id)


def _publish_many(message_id: str) -> None:
    order = decl.OrderPlaced(order_id=1, total=Decimal("1.00"))
    pgmsg.publish_many([(order, {"message_id": message_id})])


def _insert(message_id: str) -> None:
    # The plain-SQL path: an INSERT that meets the first-publish trigger.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgmsg_outbox_message (outbox, message_id, destination, topic, type, "
            "payload) VALUES (%s, %s, 'recorder', '', 't', '{}')",
            [OUTBOX, message_id],
        )


@pytest.mark.parametrize("write", [_publish, _publish_many, _insert], ids=lambda f: f.__name__)
def test_two_transactions_publishing_distinct_ids_in_opposite_orders_never_deadlock(write):
    assert opposite_orders(write, OUTBOX) == []
    assert rows(OUTBOX).count() == 4


def _keys() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT message_id FROM pgmsg_outbox_key WHERE outbox = %s", [OUTBOX])
        return {row[0] for row in cursor.fetchall()}


def test_maintenance_trims_the_keys_of_relayed_rows_and_a_later_copy_is_a_new_message():
    for message_id in ("held", "relayed"):
        _publish(message_id)
    rows(OUTBOX).filter(message_id="relayed").delete()  # as the relay's ack does
    # A key whose row is gone does not stop a new copy, trimmed or not.
    assert pgmsg.publish(OUTBOX, {}, type="t", message_id="relayed").stored
    rows(OUTBOX).filter(message_id="relayed").delete()
    start = partitions.week_start(dt.datetime.now(dt.UTC))
    outbox_partitions.maintain(now=start)
    assert _keys() == {"held"}
    assert not pgmsg.publish(OUTBOX, {}, type="t", message_id="held").stored
    assert pgmsg.publish(OUTBOX, {}, type="t", message_id="relayed").stored
    assert _keys() == {"held", "relayed"}
