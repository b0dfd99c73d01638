"""Stored notifications of exactly-once channels, from send to acknowledgement or dead letter."""

from __future__ import annotations

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Func
from django.db.models.functions import Now


class Notification(models.Model):
    """A message of an exactly-once channel, waiting to be handled (or dead).

    Handled rows are deleted in the transaction that ran the listeners, so the table holds
    only what is pending, retrying or dead. Producers that are not Django may insert
    ``(channel, payload)`` directly: every other column has a database default, and
    ``created_at``'s wakes idle workers (below).
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
    #: The statement's timestamp. Its default, pgmsg_notification_created() (migration 0028),
    #: also wakes the idle workers of every channel (wake payload "channels:*") for a row
    #: that an SQL producer, a trigger channel or the ORM inserts. There is no trigger on this
    #: table: a row trigger cost every notify() a tenth of its rate, even when its WHEN
    #: skipped the row (docs/wakeups.md). pgmsg_send() wakes the one channel and writes
    #: created_at itself, so the default does not run for it.
    created_at = models.DateTimeField(
        db_default=Func(function="pgmsg_notification_created", output_field=models.DateTimeField())
    )
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
