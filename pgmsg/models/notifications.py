"""Stored notifications of exactly-once channels, from send to acknowledgement or dead letter."""

from __future__ import annotations

import pgtrigger
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models.functions import Now

from pgmsg.core import wake


class Notification(models.Model):
    """A message of an exactly-once channel, waiting to be handled (or dead).

    Handled rows are deleted in the transaction that ran the listeners, so the table holds
    only what is pending, retrying or dead. Producers that are not Django may insert
    ``(channel, payload)`` directly: every other column has a database default, and a
    statement trigger NOTIFYs the workers.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        DEAD = "dead", "dead"

    id = models.BigAutoField(primary_key=True)
    channel = models.CharField(max_length=63)
    payload = models.JSONField(encoder=DjangoJSONEncoder)
    status = models.CharField(
        max_length=8, choices=Status.choices, default=Status.PENDING, db_default=Status.PENDING
    )
    attempts = models.IntegerField(default=0, db_default=0)
    #: Not claimed before this time (retry backoff).
    available_at = models.DateTimeField(db_default=Now())
    created_at = models.DateTimeField(db_default=Now())
    last_error = models.TextField(blank=True, default="", db_default="")
    last_failed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pgmsg_notification"
        indexes = [
            # The claim query: due pending rows in id order.
            models.Index(
                fields=["id"],
                condition=models.Q(status="pending"),
                name="pgmsg_notification_pending",
            ),
            models.Index(fields=["status", "channel"], name="pgmsg_notification_status"),
        ]
        permissions = [
            ("replay_notification", "Can replay dead or retrying notifications"),
            ("discard_notification", "Can discard notifications"),
        ]
        triggers = [
            # Wakes idle workers of the row's channel (pgmsg/core/wake.py: only while one is
            # idle, so a busy system commits without NOTIFY). A row trigger whose WHEN skips
            # every row after the first of its channel in a transaction: pgmsg_wake holds its
            # producing lock until the transaction ends, so one call per channel and
            # transaction is enough (docs/wakeups.md), and a skipped row costs no trigger call
            # (a multi-row INSERT queues its rows before the first call: the function checks
            # again).
            # It replaced a statement trigger with a transition table, which cost one-row
            # inserts (every notify()) more than the insert itself. notify() wakes and marks
            # the channel inside pgmsg_send (migration 0016) before it inserts.
            pgtrigger.Trigger(
                name="pgmsg_wake_workers",
                level=pgtrigger.Row,
                when=pgtrigger.After,
                operation=pgtrigger.Insert,
                condition=pgtrigger.Condition(f"{wake.WOKEN_SQL} IS DISTINCT FROM NEW.channel"),
                func=f"{wake.wake_once_sql('NEW.channel')} RETURN NULL;",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.channel} #{self.id} ({self.state})"

    @property
    def state(self) -> str:
        """pending, retrying (pending after a failure) or dead."""
        if self.status == self.Status.DEAD:
            return "dead"
        return "retrying" if self.attempts else "pending"


class NotificationDeadLetter(Notification):
    """The dead notifications alone: the admin's "dead letters (channels)" entry."""

    class Meta:
        proxy = True
        verbose_name = "dead letter (channels)"
        verbose_name_plural = "dead letters (channels)"
