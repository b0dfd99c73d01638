"""Models of the test app: a model with a trigger channel, and a table of handler effects."""

import pgtrigger
from django.db import models

import pgmsg


class Order(models.Model):
    reference = models.CharField(max_length=40)
    total = models.DecimalField(max_digits=12, decimal_places=2, default=0)
    weight = models.FloatField(default=0)
    placed_at = models.DateTimeField(null=True)
    details = models.JSONField(default=dict)

    class Meta:
        triggers = [
            pgmsg.ChannelTrigger(
                channel="order_changed",
                operation=pgtrigger.Insert | pgtrigger.Update | pgtrigger.Delete,
            )
        ]


#: The longest channel name pgmsg accepts (57 bytes): its trigger name must be derived.
LONG_CHANNEL = "warehouse.inventory.stock_level_changed.by_location.daily"


class StockLevel(models.Model):
    """A trigger channel whose name is as long as names may be."""

    sku = models.CharField(max_length=40)

    class Meta:
        triggers = [pgmsg.ChannelTrigger(channel=LONG_CHANNEL, operation=pgtrigger.Insert)]


class Effect(models.Model):
    """One row per handler run that committed: duplicates here mean a broken guarantee."""

    channel = models.CharField(max_length=63)
    key = models.TextField()
    listener = models.CharField(max_length=40, default="")
    data = models.JSONField(default=dict)
    worker_pid = models.IntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["channel", "key"])]


from pgmsg_tests.testapp.every_field import EveryField  # noqa: E402,F401
from pgmsg_tests.testapp.inbox_models import WebhookEvent  # noqa: E402,F401
