"""Outbox messages: written in the producer's transaction, deleted once a broker confirmed them."""

from __future__ import annotations

import pgtrigger
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models.functions import Now

from pgmsg.core import wake

#: NOTIFY payload prefix on the wake channel: "outbox:<outbox name>".
WAKE_PREFIX = "outbox:"


class OutboxMessage(models.Model):
    """One message on its way to a broker. The table holds only what is pending or dead:
    the relay deletes a row in the transaction that follows the broker's confirmation.

    ``id`` is also the order of a key's messages: publish() takes a transaction-level lock on
    (outbox, key) before the row gets its id, so one key's ids follow commit order.

    The table is partitioned by week of ``created_at`` (docs/storage.md): its primary key in
    the database is ``(id, created_at)``, ``id`` alone stays unique (one sequence).
    """

    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        DEAD = "dead", "dead"

    id = models.BigAutoField(primary_key=True)
    outbox = models.CharField(max_length=63)
    #: The stable id brokers see (AMQP message_id, Nats-Msg-Id, a field of the stream entry).
    message_id = models.TextField()
    #: The name of a PGMSG["OUTBOX_DESTINATIONS"] entry.
    destination = models.CharField(max_length=63)
    #: Routing key, subject, stream key or MQTT topic, as the destination reads it.
    topic = models.TextField()
    type = models.TextField()
    #: Messages of one key reach the broker in commit order; None: no order to keep.
    key = models.TextField(null=True, blank=True)
    payload = models.JSONField(encoder=DjangoJSONEncoder)
    headers = models.JSONField(default=dict, db_default={})
    status = models.CharField(
        max_length=8, choices=Status.choices, default=Status.PENDING, db_default=Status.PENDING
    )
    #: Failed publish attempts (refusals); travels as the pgmsg-redelivery-count header.
    attempts = models.IntegerField(default=0, db_default=0)
    last_error = models.TextField(blank=True, default="", db_default="")
    #: Not published before this time (retry backoff).
    available_at = models.DateTimeField(db_default=Now())
    created_at = models.DateTimeField(db_default=Now())
    last_failed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pgmsg_outbox_message"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status__in=["pending", "dead"]),
                name="pgmsg_outbox_message_status",
            ),
        ]
        indexes = [
            # Idempotency: the first-publish trigger looks a message id up in every partition
            # (PostgreSQL has no unique index across partitions that leaves out the key).
            models.Index(fields=["outbox", "message_id"], name="pgmsg_outbox_message_key"),
            # The relay's claim: pending rows of one outbox in id order.
            models.Index(
                fields=["outbox", "id"],
                condition=models.Q(status="pending"),
                name="pgmsg_outbox_pending",
            ),
            # Messages that failed (dead, or backing off): the few rows that can hold a key
            # back (a key's messages are published in order, none after a failure).
            models.Index(
                fields=["outbox", "key", "id"],
                condition=models.Q(status="dead") | models.Q(attempts__gt=0),
                name="pgmsg_outbox_failed",
            ),
        ]
        permissions = [
            ("replay_outboxmessage", "Can replay dead or retrying outbox messages"),
            ("discard_outboxmessage", "Can discard outbox messages"),
        ]
        triggers = [
            # Idempotency across partitions, as the inbox's first-receipt trigger does it
            # (models/inbox.py), with the keys in pgmsg_outbox_key (OutboxKey): a message id
            # the outbox still holds is skipped (the insert returns no row), whichever
            # partition holds the first copy; a concurrent publish of the same id waits on the
            # key's index entry (or row lock) for the first one's transaction; publishes of
            # distinct ids never wait for each other. A key outlives its relayed row until the
            # relays' maintenance trims it: such an id is stored again, as before the key
            # table. Under REPEATABLE READ the wait could not see the first copy, so that
            # level is refused. Rows put back by maintenance keep their id and are let through.
            pgtrigger.Trigger(
                name="pgmsg_outbox_first_publish",
                level=pgtrigger.Row,
                when=pgtrigger.Before,
                operation=pgtrigger.Insert,
                func=(
                    "IF current_setting('transaction_isolation') = 'repeatable read' THEN "
                    "RAISE EXCEPTION 'pgmsg: outbox % message %: publish in a READ COMMITTED "
                    "or SERIALIZABLE transaction (REPEATABLE READ cannot see a concurrent "
                    "first copy)', NEW.outbox, NEW.message_id "
                    "USING ERRCODE = 'feature_not_supported'; END IF; "
                    "LOOP INSERT INTO pgmsg_outbox_key (outbox, message_id) "
                    "VALUES (NEW.outbox, NEW.message_id) ON CONFLICT DO NOTHING; "
                    "IF FOUND THEN RETURN NEW; END IF; "
                    "PERFORM FROM pgmsg_outbox_key WHERE outbox = NEW.outbox "
                    "AND message_id = NEW.message_id FOR UPDATE; "
                    "EXIT WHEN FOUND; END LOOP; "
                    "IF EXISTS (SELECT FROM pgmsg_outbox_message WHERE outbox = NEW.outbox "
                    "AND message_id = NEW.message_id AND id IS DISTINCT FROM NEW.id) THEN "
                    "RETURN NULL; END IF; RETURN NEW;"
                ),
            ),
            # One wake-up per outbox per statement, only while a relay for it is idle
            # (core/wake.py; NOTIFY is delivered at commit, identical payloads fold into one):
            # the relay publishes at commit, not at the sweep.
            pgtrigger.Trigger(
                name="pgmsg_outbox_wake",
                level=pgtrigger.Statement,
                when=pgtrigger.After,
                operation=pgtrigger.Insert,
                referencing=pgtrigger.Referencing(new="new_rows"),
                func=(
                    "PERFORM " + wake.wake_sql(f"'{WAKE_PREFIX}' || o.outbox") + " "
                    "FROM (SELECT DISTINCT outbox FROM new_rows) AS o; RETURN NULL;"
                ),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.outbox} {self.message_id} ({self.state})"

    @property
    def state(self) -> str:
        """pending, retrying (pending after a refusal) or dead."""
        if self.status == self.Status.DEAD:
            return "dead"
        return "retrying" if self.attempts else "pending"


class OutboxKey(models.Model):
    """The ``(outbox, message_id)`` of every outbox message: unique across the partitions of
    pgmsg_outbox_message. Written by the first-publish trigger; a key outlives its row (the
    relay deletes a row it published) until maintenance trims it
    (pgmsg.outbox.partitions.trim_keys)."""

    pk = models.CompositePrimaryKey("outbox", "message_id")
    outbox = models.CharField(max_length=63)
    message_id = models.TextField()

    class Meta:
        db_table = "pgmsg_outbox_key"

    def __str__(self) -> str:
        return f"{self.outbox} {self.message_id}"
