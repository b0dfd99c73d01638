"""Stored notifications of exactly-once channels: pending ones, and dead letters apart."""

from __future__ import annotations

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import F, Func, Q
from django.db.models.functions import Now


class Notification(models.Model):
    """A message of an exactly-once channel, waiting to be handled (pending or retrying).

    Handled rows are deleted in the transaction that ran the listeners, and a message that
    gives up moves to ``NotificationDeadLetter``'s table in that transaction, so this table
    holds only what is still to be handled. Producers that are not Django may insert
    ``(channel, payload)`` directly: every other column has a database default, and
    ``created_at``'s wakes idle workers (below).

    Its one full index is the primary key, which the claim reads in id order: every other
    index is a page more that each producer's commit writes and flushes, and with 32
    producers on 2 cores two more indexes cost a tenth of notify()'s rate
    (docs/decisions.md, "Dead letters in a table of their own"). Hence dead letters in a
    table of their own (they needed an index of the pending rows that left them out) and no
    status column.
    """

    id = models.BigAutoField(primary_key=True)
    channel = models.CharField(max_length=63)
    payload = models.JSONField(encoder=DjangoJSONEncoder)
    #: Failed attempts so far: 0 for a message never tried, or tried and put back unhandled.
    attempts = models.IntegerField(default=0, db_default=0)
    #: Not claimed before this time (retry backoff).
    available_at = models.DateTimeField(db_default=Now())
    #: The statement's timestamp. Its default, pgmsg_notification_created()
    #: (channels/functions.sql), also wakes the idle workers of every channel (wake payload
    #: "channels:*") for a row that an SQL producer, a trigger channel or the ORM inserts.
    #: There is no trigger on this table: a row trigger cost every notify() a tenth of its
    #: rate, even when its WHEN skipped the row (docs/decisions.md). pgmsg_send() wakes the one
    #: channel and writes created_at itself, so the default does not run for it.
    created_at = models.DateTimeField(
        db_default=Func(function="pgmsg_notification_created", output_field=models.DateTimeField())
    )
    last_error = models.TextField(blank=True, default="", db_default="")
    last_failed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pgmsg_notification"
        indexes = [
            # Retries (and rows an SQL producer delayed), for a worker's "when is the next one
            # due" (seconds_until_due): a row inserted with the defaults is available when it
            # was created and has no attempts, so notify()'s rows do not enter this index.
            models.Index(
                fields=["channel", "available_at"],
                condition=Q(available_at__gt=F("created_at")) | Q(attempts__gt=0),
                name="pgmsg_notification_retrying",
            ),
        ]
        permissions = [
            ("replay_notification", "Can replay dead or retrying notifications"),
            ("discard_notification", "Can discard notifications"),
        ]

    def __str__(self) -> str:
        return f"{self.channel} #{self.id} ({self.state})"

    @property
    def state(self) -> str:
        """pending, or retrying (pending after a failure)."""
        return "retrying" if self.attempts else "pending"


class NotificationDeadLetter(models.Model):
    """A notification that gave up (its attempts spent, or a failure that cannot succeed on a
    retry), moved here from ``pgmsg_notification`` with its id, in the transaction that ran
    its last attempt. ``replay()`` moves it back; ``discard()`` deletes it. The admin's
    "dead letters (channels)" entry; its operations take ``Notification``'s permissions."""

    #: The notification's own id, kept through death and replay.
    id = models.BigIntegerField(primary_key=True)
    channel = models.CharField(max_length=63)
    payload = models.JSONField(encoder=DjangoJSONEncoder)
    attempts = models.IntegerField()
    created_at = models.DateTimeField()
    last_error = models.TextField(blank=True, default="")
    #: When its last attempt failed (when it died).
    last_failed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pgmsg_notification_dead"
        indexes = [models.Index(fields=["channel", "id"], name="pgmsg_notification_dead_ch")]
        verbose_name = "dead letter (channels)"
        verbose_name_plural = "dead letters (channels)"

    def __str__(self) -> str:
        return f"{self.channel} #{self.id} (dead)"

    @property
    def state(self) -> str:
        return "dead"
