"""The event store's tables: streams, events, and the checkpoints of subscription partitions."""

from __future__ import annotations

import pgtrigger
from django.db import models
from django.db.models.functions import Now

from pgmsg.core import wake

#: Set (transaction-local) by pgmsg_append around its INSERT, which does the triggers' work
#: itself (events/functions.sql): the triggers' WHEN skips that statement without calling them.
#: Any other INSERT into pgmsg_event meets the triggers as before.
NOT_APPENDING = pgtrigger.Condition(
    "current_setting('pgmsg.appending', true) IS DISTINCT FROM 'on'"
)


class Stream(models.Model):
    """One row per stream: its current version, locked by each append (optimistic concurrency)."""

    name = models.TextField(primary_key=True)
    version = models.IntegerField(default=0)

    class Meta:
        db_table = "pgmsg_stream"

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"


class StoredEvent(models.Model):
    """An appended event. Rows are never updated or deleted by pgmsg.

    The table also has a ``transaction_id xid8`` column (added by the migration in SQL, since
    Django has no xid8 field): the appending transaction's id, raised to the stream's previous
    event's value when lower, so that ``(transaction_id, position)`` is a gap-free read order
    that keeps each stream's version order (see docs/events.md).

    The table is partitioned by month of ``recorded_at`` (docs/storage.md), so that old months
    can be archived to Parquet and dropped: its primary key in the database is
    ``(position, recorded_at)``. PostgreSQL has no unique index across partitions that leaves
    the partition key out: a stream's versions stay unique because every append holds the
    stream's row lock while it numbers them, and message ids by the key trigger and the key
    table (EventKey).
    """

    position = models.BigAutoField(primary_key=True)
    stream_name = models.TextField()
    #: The part of the stream name before the first '-'.
    category = models.TextField()
    version = models.IntegerField()
    type = models.TextField()
    data = models.JSONField()
    #: correlation_id and causation_id, and whatever the appender adds.
    metadata = models.JSONField(default=dict)
    message_id = models.UUIDField(db_index=True)
    recorded_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgmsg_event"
        verbose_name = "event"
        indexes = [
            # A stream's events in version order (unique in practice: see above).
            models.Index(fields=["stream_name", "version"], name="pgmsg_event_version"),
        ]
        triggers = [
            # Idempotency across partitions: an event whose message id is stored already fails
            # the statement with a unique violation, as the unique index of the unpartitioned
            # table did (the append writes nothing and looks closer). The one unique index over
            # every partition is pgmsg_event_key's: a concurrent append of the same id waits
            # there for the first one's transaction, as it did on the unique index of the
            # unpartitioned table. A key without its row (a row moved between partitions, or a
            # dropped one) lets the event in. Once per statement, set-based: a row trigger
            # (one PL/pgSQL call per event) took 27 us of an event's 50 in a 100-event append.
            # It fires for inserts through pgmsg_event, not into one month's table directly.
            pgtrigger.Trigger(
                name="pgmsg_event_keys",
                level=pgtrigger.Statement,
                when=pgtrigger.After,
                operation=pgtrigger.Insert,
                condition=NOT_APPENDING,
                referencing=pgtrigger.Referencing(new="new_rows"),
                declare=[("taken", "uuid"), ("known", "uuid[]")],
                func=(
                    # An id twice in the statement; else the ids whose key was there already,
                    # and of those one that another event holds. Only then is pgmsg_event
                    # itself read: planning that read locks every month's table until the
                    # transaction ends, which would hold up sealing and archiving.
                    "SELECT message_id INTO taken FROM new_rows GROUP BY message_id "
                    "HAVING count(*) > 1 LIMIT 1; "
                    "IF taken IS NULL THEN "
                    "WITH added AS (INSERT INTO pgmsg_event_key (message_id) "
                    "SELECT message_id FROM new_rows ORDER BY position "
                    "ON CONFLICT DO NOTHING RETURNING message_id) "
                    "SELECT array_agg(n.message_id) INTO known FROM new_rows AS n "
                    "WHERE NOT EXISTS (SELECT FROM added AS a WHERE a.message_id = n.message_id); "
                    "IF known IS NOT NULL THEN "
                    "SELECT n.message_id INTO taken FROM new_rows AS n "
                    "WHERE n.message_id = ANY(known) AND EXISTS (SELECT FROM pgmsg_event AS e "
                    "WHERE e.message_id = n.message_id AND e.position <> n.position) LIMIT 1; "
                    "END IF; "
                    "END IF; "
                    "IF taken IS NOT NULL THEN RAISE unique_violation USING MESSAGE = format("
                    "'message id %s is stored already', taken); END IF; RETURN NULL;"
                ),
            ),
            # One wake-up per category per statement ("events:<category>"), only while a worker
            # serving that category (or every category: "events") is idle (core/wake.py).
            pgtrigger.Trigger(
                name="pgmsg_wake_subscriptions",
                level=pgtrigger.Statement,
                when=pgtrigger.After,
                operation=pgtrigger.Insert,
                condition=NOT_APPENDING,
                referencing=pgtrigger.Referencing(new="new_rows"),
                func=(
                    "PERFORM " + wake.wake_sql("'events:' || c.category", "'events'") + " "
                    "FROM (SELECT DISTINCT category FROM new_rows) AS c; RETURN NULL;"
                ),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.stream_name} v{self.version} {self.type} @{self.position}"


class EventKey(models.Model):
    """The message id of every event in pgmsg_event: unique across its partitions (which
    PostgreSQL cannot index uniquely by message id). Written by the key trigger;
    pgmsg_archive deletes the keys of the events it drops."""

    message_id = models.UUIDField(primary_key=True)

    class Meta:
        db_table = "pgmsg_event_key"

    def __str__(self) -> str:
        return str(self.message_id)


class Snapshot(models.Model):
    """The latest saved state of an event-sourced aggregate, to load long streams quickly."""

    stream_name = models.TextField(primary_key=True)
    #: The stream version the state reflects.
    version = models.IntegerField()
    #: The aggregate class's snapshot_version when taken; other values are ignored.
    schema = models.IntegerField()
    state = models.JSONField()
    taken_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgmsg_snapshot"

    def __str__(self) -> str:
        return f"{self.stream_name} at v{self.version}"


class SubscriptionPartition(models.Model):
    """Where one partition of a subscription stands: its checkpoint, and whether it is stopped.

    A worker holds a partition by locking this row (FOR UPDATE SKIP LOCKED) for the
    transaction that runs the handlers and moves the checkpoint.
    """

    class Status(models.TextChoices):
        ACTIVE = "active", "active"
        STOPPED = "stopped", "stopped"

    id = models.BigAutoField(primary_key=True)
    subscription = models.CharField(max_length=63)
    partition = models.IntegerField()
    #: Every event at or before (checkpoint_transaction, checkpoint_position) in read order is
    #: done. checkpoint_transaction holds an xid8 value as a bigint.
    checkpoint_transaction = models.BigIntegerField(default=0)
    checkpoint_position = models.BigIntegerField(default=0)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.ACTIVE)
    #: Failed attempts on the event after the checkpoint.
    attempts = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_default=Now())
    last_error = models.TextField(blank=True, default="")
    #: The position of the event that failed last (the one a skip passes over).
    failed_position = models.BigIntegerField(null=True, blank=True)
    handled = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgmsg_subscription_partition"
        constraints = [
            models.UniqueConstraint(
                fields=["subscription", "partition"], name="pgmsg_subscription_partition_key"
            ),
        ]
        permissions = [
            ("operate_subscriptionpartition", "Can skip, retry or reset subscription partitions"),
        ]

    def __str__(self) -> str:
        return f"{self.subscription}[{self.partition}] ({self.state})"

    @property
    def state(self) -> str:
        """active, retrying (active after a failure) or stopped."""
        if self.status == self.Status.STOPPED:
            return "stopped"
        return "retrying" if self.attempts else "active"
