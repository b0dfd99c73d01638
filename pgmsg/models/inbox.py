"""Inbox messages received from outside, from receipt to processed, dead or discarded."""

from __future__ import annotations

import pgtrigger
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models.functions import Now

from pgmsg.core import wake

#: NOTIFY payload prefix on the wake channel: "inbox:<inbox name>".
WAKE_PREFIX = "inbox:"

#: Set (transaction-local) by pgmsg_receive around its INSERT, which does the first-receipt
#: check and the wake-up itself (inbox/functions.sql): the triggers' WHEN skips that row and
#: statement without calling them. Any other INSERT meets the triggers as before.
NOT_RECEIVING = pgtrigger.Condition(
    "current_setting('pgmsg.receiving', true) IS DISTINCT FROM 'on'"
)


class InboxMessage(models.Model):
    """One message of one inbox. ``(inbox, message_id)`` is the idempotency key.

    Producers that are not Django may insert ``(inbox, message_id, type, payload)`` directly:
    every other column has a database default, a row trigger skips a message id the inbox
    already holds, and a statement trigger NOTIFYs the workers. The table also has a
    database-only column ``transaction_id xid8 DEFAULT pg_current_xact_id()`` (added by the
    migration with SQL, since Django has no xid8 field) for gap-free incremental export.

    The table is partitioned by week of ``received_at`` (docs/storage.md): its primary key in
    the database is ``(id, received_at)``, ``id`` alone stays unique (one sequence).
    """

    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        PROCESSED = "processed", "processed"
        DEAD = "dead", "dead"
        DISCARDED = "discarded", "discarded"

    #: Arrival order; ordered inboxes handle an aggregate's messages by (transaction_id, id).
    id = models.BigAutoField(primary_key=True)
    inbox = models.CharField(max_length=63)
    message_id = models.TextField()
    type = models.TextField()
    source = models.TextField(blank=True, default="", db_default="")
    aggregate_id = models.TextField(null=True, blank=True)
    payload = models.JSONField(encoder=DjangoJSONEncoder)
    trace_id = models.TextField(blank=True, default="", db_default="")
    status = models.CharField(
        max_length=10, choices=Status.choices, default=Status.PENDING, db_default=Status.PENDING
    )
    #: Failed attempts so far.
    attempts = models.IntegerField(default=0, db_default=0)
    last_error = models.TextField(blank=True, default="", db_default="")
    #: Not claimed before this time (retry backoff).
    available_at = models.DateTimeField(db_default=Now())
    received_at = models.DateTimeField(db_default=Now())
    processed_at = models.DateTimeField(null=True, blank=True)
    last_failed_at = models.DateTimeField(null=True, blank=True)
    discarded_at = models.DateTimeField(null=True, blank=True)
    discard_reason = models.TextField(blank=True, default="", db_default="")

    class Meta:
        db_table = "pgmsg_inbox_message"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status__in=["pending", "processed", "dead", "discarded"]),
                name="pgmsg_inbox_message_status",
            ),
            models.CheckConstraint(
                condition=~models.Q(message_id="") & ~models.Q(type=""),
                name="pgmsg_inbox_message_id_type",
            ),
        ]
        indexes = [
            # Idempotency: the first-receipt trigger looks a message id up in every partition
            # (PostgreSQL has no unique index across partitions that leaves out the key).
            models.Index(fields=["inbox", "message_id"], name="pgmsg_inbox_message_key"),
            # Unordered claim: due pending rows of one inbox in id order.
            models.Index(
                fields=["inbox", "id"],
                condition=models.Q(status="pending"),
                name="pgmsg_inbox_pending",
            ),
            # Claim by priority: one level's types, each a range in id order (claim_types).
            models.Index(
                fields=["inbox", "type", "id"],
                condition=models.Q(status="pending"),
                name="pgmsg_inbox_pending_type",
            ),
            # Ordered claim and gap check: the head (lowest open id) of each aggregate.
            models.Index(
                fields=["inbox", "aggregate_id", "id"],
                condition=models.Q(status__in=["pending", "dead"]),
                name="pgmsg_inbox_open_aggregate",
            ),
            # Throughput (processed in the last minute) and retention.
            models.Index(
                fields=["inbox", "processed_at"],
                condition=models.Q(status="processed"),
                name="pgmsg_inbox_processed",
            ),
            # Retention: the few dead and discarded rows, checked one by one for whether they
            # must stay, without a scan of the processed ones (pgmsg/inbox/retention.sql).
            models.Index(
                fields=["inbox", "id"],
                condition=models.Q(status__in=["dead", "discarded"]),
                name="pgmsg_inbox_failed",
            ),
        ]
        permissions = [
            ("replay_inboxmessage", "Can replay dead or retrying inbox messages"),
            ("discard_inboxmessage", "Can discard inbox messages"),
        ]
        triggers = [
            # The first-receipt and wake triggers skip the one INSERT of pgmsg_receive()
            # (receive(); inbox/functions.sql), which does their work itself: see NOT_RECEIVING.
            # Idempotency across partitions: a message id the inbox already holds is skipped
            # (the insert returns no row), whichever partition holds the first copy. The one
            # unique index over every partition is pgmsg_inbox_key's (InboxKey): a new key
            # means no copy anywhere (every row has its key), so the row goes in without a
            # look at the partitions; a concurrent receipt of the same id waits on that index
            # entry for the first one's transaction, as on a unique index, and receipts of
            # distinct ids never wait for each other (no deadlock, whatever their order). A
            # key that is there already is locked (a receipt of that id waits for this one)
            # and the partitions are looked up: a key outlives its row until retention trims
            # it, and such an id is stored again. A key gone between the two statements (a
            # trim) is inserted again (the loop). Under REPEATABLE READ the wait could not see
            # the first copy, so that level is refused. Rows moved between partitions keep
            # their id and are let through.
            pgtrigger.Trigger(
                name="pgmsg_inbox_first_receipt",
                level=pgtrigger.Row,
                when=pgtrigger.Before,
                operation=pgtrigger.Insert,
                condition=NOT_RECEIVING,
                func=(
                    "IF current_setting('transaction_isolation') = 'repeatable read' THEN "
                    "RAISE EXCEPTION 'pgmsg: inbox % message %: receive in a READ COMMITTED "
                    "or SERIALIZABLE transaction (REPEATABLE READ cannot see a concurrent "
                    "first copy)', NEW.inbox, NEW.message_id "
                    "USING ERRCODE = 'feature_not_supported'; END IF; "
                    "LOOP INSERT INTO pgmsg_inbox_key (inbox, message_id) "
                    "VALUES (NEW.inbox, NEW.message_id) ON CONFLICT DO NOTHING; "
                    "IF FOUND THEN RETURN NEW; END IF; "
                    "PERFORM FROM pgmsg_inbox_key WHERE inbox = NEW.inbox "
                    "AND message_id = NEW.message_id FOR UPDATE; "
                    "EXIT WHEN FOUND; END LOOP; "
                    "IF EXISTS (SELECT FROM pgmsg_inbox_message WHERE inbox = NEW.inbox "
                    "AND message_id = NEW.message_id AND id IS DISTINCT FROM NEW.id) THEN "
                    "RETURN NULL; END IF; RETURN NEW;"
                ),
            ),
            # The export keeps a log of row versions (pgmsg.export): a row that changes gets
            # the updating transaction's id, so the next incremental export takes its new
            # version, gap-free like an insert. Updates that change nothing keep it.
            pgtrigger.Trigger(
                name="pgmsg_inbox_version",
                level=pgtrigger.Row,
                when=pgtrigger.Before,
                operation=pgtrigger.Update,
                # Only when a message is done with (processed or discarded): pending and dead
                # rows keep their receipt transaction id, which the ordered claim sorts by (a
                # failed, dead or replayed head must stay ahead of the messages behind it).
                # Not when the update stamps it itself (the worker's ack, inbox.sql): the
                # cheap tests come first, the row comparison last (a WHEN's ANDed conditions
                # are evaluated in order and stop at the first false one).
                condition=pgtrigger.Condition(
                    "NEW.status IN ('processed', 'discarded') "
                    "AND NEW.transaction_id IS DISTINCT FROM pg_current_xact_id() "
                    "AND OLD.* IS DISTINCT FROM NEW.*"
                ),
                func="NEW.transaction_id := pg_current_xact_id(); RETURN NEW;",
            ),
            # One wake-up per inbox per statement, only while a worker for it is idle
            # (core/wake.py; NOTIFY is delivered at commit, identical payloads fold into one).
            # Duplicates skipped by the first-receipt trigger are not in new_rows, so an
            # all-duplicate insert wakes nobody.
            pgtrigger.Trigger(
                name="pgmsg_inbox_wake",
                level=pgtrigger.Statement,
                when=pgtrigger.After,
                operation=pgtrigger.Insert,
                condition=NOT_RECEIVING,
                referencing=pgtrigger.Referencing(new="new_rows"),
                func=(
                    "PERFORM " + wake.wake_sql(f"'{WAKE_PREFIX}' || i.inbox") + " "
                    "FROM (SELECT DISTINCT inbox FROM new_rows) AS i; RETURN NULL;"
                ),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.inbox} {self.message_id} ({self.state})"

    @property
    def state(self) -> str:
        """pending, retrying (pending after a failure), processed, dead or discarded."""
        if self.status == self.Status.PENDING and self.attempts:
            return "retrying"
        return self.status


class InboxKey(models.Model):
    """The ``(inbox, message_id)`` of every inbox message: unique across the partitions of
    pgmsg_inbox_message (which PostgreSQL cannot index uniquely without the partition key).
    Written by the first-receipt trigger and pgmsg_receive; a key may outlive its row, until
    retention trims it (pgmsg.inbox.retention.trim_keys)."""

    pk = models.CompositePrimaryKey("inbox", "message_id")
    inbox = models.CharField(max_length=63)
    message_id = models.TextField()

    class Meta:
        db_table = "pgmsg_inbox_key"

    def __str__(self) -> str:
        return f"{self.inbox} {self.message_id}"


class InboxDeadLetter(InboxMessage):
    """The dead inbox messages alone: the admin's "dead letters (inboxes)" entry."""

    class Meta:
        proxy = True
        verbose_name = "dead letter (inboxes)"
        verbose_name_plural = "dead letters (inboxes)"
