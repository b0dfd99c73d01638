"""The shop's tables. Order has a trigger channel: PostgreSQL reports every write to it."""

import pgtrigger
from django.db import models

import pgmsg


class Order(models.Model):
    customer = models.CharField(max_length=100)
    total = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(max_length=20, default="new")

    class Meta:
        triggers = [
            pgmsg.ChannelTrigger(
                channel="shop.order_changed",
                operation=pgtrigger.Insert | pgtrigger.Update,
            )
        ]


class Shipment(models.Model):
    """Written by a listener: exactly one per order, even with several workers."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="shipment")
    worker_pid = models.IntegerField()


class Invoice(models.Model):
    """Written by a listener of a declared channel (one per OrderPaid message)."""

    order_id = models.BigIntegerField()
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    paid_at = models.DateTimeField()
    worker_pid = models.IntegerField()


class Payment(models.Model):
    """Written by the inbox handler: one per captured-payment webhook, however often sent."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="payments")
    provider_ref = models.CharField(max_length=100)


class LoyaltyBalance(models.Model):
    """A projection of the loyalty event streams, kept by a subscription."""

    customer = models.CharField(max_length=100, unique=True)
    points = models.IntegerField(default=0)
    events_seen = models.IntegerField(default=0)
