"""Every documented channel name (up to 57 bytes) works as a trigger channel."""

import pytest
from django.db import connection

from pgmsg.channels import triggers
from pgmsg.core import names
from pgmsg.models import Notification
from pgmsg_tests.testapp.models import LONG_CHANNEL, StockLevel

pytestmark = pytest.mark.django_db


def test_short_names_are_unchanged():
    assert triggers.trigger_name("order_changed") == "pgmsg_order_changed"
    assert triggers.trigger_name("shop.order_changed") == "pgmsg_shop_order_changed"


def test_a_too_long_name_gets_a_stable_hashed_name_within_pgtriggers_limit():
    assert len(LONG_CHANNEL.encode()) == names.MAX_NAME_LENGTH
    # Written out: a change to the derivation would rename installed triggers.
    assert triggers.trigger_name(LONG_CHANNEL) == "pgmsg_warehouse_inventory_stock_leve_21454c83a4"
    assert len(triggers.trigger_name(LONG_CHANNEL)) == triggers.MAX_TRIGGER_NAME_LENGTH
    other = LONG_CHANNEL[:-1] + "z"
    assert triggers.trigger_name(other) != triggers.trigger_name(LONG_CHANNEL)


def test_a_57_byte_channel_trigger_is_installed_by_its_migration_and_fires():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'testapp_stocklevel'::regclass "
            "AND NOT tgisinternal"
        )
        installed = [row[0] for row in cursor.fetchall()]
    assert installed == ["pgtrigger_pgmsg_warehouse_inventory_stock_leve_21454c83a4_b61e6"]
    StockLevel.objects.create(sku="A-1")
    (row,) = Notification.objects.filter(channel=LONG_CHANNEL)
    assert row.payload["new"]["sku"] == "A-1"
