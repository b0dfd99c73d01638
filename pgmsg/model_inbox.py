"""Inbox over a project's own model: its rows are the messages, one of its fields the mark."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pgtrigger
from django.db import connections, models, transaction
from psycopg import sql as pgsql

from pgmsg import channels, conf, errors, inbox, inbox_worker
from pgmsg import worker as wk


def wake_trigger(inbox_name: str, *, name: str = "pgmsg_inbox_wake") -> pgtrigger.Trigger:
    """A statement trigger for a model inbox's table: NOTIFY the workers on INSERT.

    Put it in the model's ``Meta.triggers``; without it, workers find new rows at the next
    sweep (PGMSG SWEEP_INTERVAL) instead of at commit.
    """
    channels.validate_name(inbox_name, kind="inbox")  # safe as a literal below
    return pgtrigger.Trigger(
        name=name,
        level=pgtrigger.Statement,
        when=pgtrigger.After,
        operation=pgtrigger.Insert,
        func=f"PERFORM pg_notify('{channels.WAKE_CHANNEL}', '{inbox.WAKE_PREFIX}{inbox_name}'); "
        "RETURN NULL;",
    )


@dataclasses.dataclass(frozen=True)
class ModelInbox(inbox.Inbox):
    """An inbox whose messages are the rows of an existing model::

        webhooks = pgmsg.ModelInbox("webhooks", model=WebhookEvent, id_field="event_id",
                                    type_field="kind", processed_field="processed_at")

    ``id_field``: a unique field, the idempotency key (receipt is the project's own INSERT;
    the unique constraint refuses a duplicate). ``type_field``: selects the handler.
    ``processed_field``: a nullable DateTimeField (set to now()) or a BooleanField (set to
    true) marking the row processed, in the transaction of the handler. ``aggregate_field``:
    optional, for ``--partition``. The handler's message carries the model instance as
    ``payload``. Failures are kept in pgmsg_inbox_message (attempts, error, backoff, dead), so
    replay, discard, health and the admin work as for other inboxes. Unordered, no priorities.
    """

    model: Any = None
    id_field: str = ""
    type_field: str = ""
    processed_field: str = ""
    aggregate_field: str | None = None

    def __post_init__(self) -> None:
        label = f"model inbox {self.name!r}"
        if not (isinstance(self.model, type) and issubclass(self.model, models.Model)):
            raise errors.ConfigurationError(
                f"{label}: model must be a Django model class, got {self.model!r}"
            )
        if self.ordered or self.priorities:
            raise errors.ConfigurationError(f"{label}: ordered and priorities are not supported")
        key = self._field("id_field", self.id_field)
        if not (key.primary_key or key.unique):
            raise errors.ConfigurationError(
                f"{label}: id_field {self.id_field!r} must be unique (it is the idempotency key)"
            )
        self._field("type_field", self.type_field)
        mark = self._field("processed_field", self.processed_field)
        if not (
            isinstance(mark, models.DateTimeField)
            and mark.null
            or isinstance(mark, models.BooleanField)
        ):
            raise errors.ConfigurationError(
                f"{label}: processed_field {self.processed_field!r} must be a nullable "
                "DateTimeField or a BooleanField"
            )
        if self.aggregate_field is not None:
            self._field("aggregate_field", self.aggregate_field)
        super().__post_init__()

    def _field(self, option: str, name: Any) -> models.Field:
        try:
            return self.model._meta.get_field(name)
        except Exception:
            raise errors.ConfigurationError(
                f"model inbox {self.name!r}: {option} {name!r} is not a field of "
                f"{self.model._meta.label}"
            ) from None

    def __hash__(self) -> int:
        return hash(self.name)

    def make_source(self, partition: tuple[int, int] | None) -> ModelInboxSource:
        return ModelInboxSource(self, partition)


class ModelInboxSource(inbox_worker.InboxSource):
    """Drains a model inbox: unprocessed rows without a dead, discarded or backing-off record."""

    def __init__(self, spec: ModelInbox, partition: tuple[int, int] | None = None) -> None:
        super().__init__(spec, partition)
        self._sql: dict[str, str] | None = None

    def _queries(self, db: str) -> dict[str, str]:
        if self._sql is None:
            self._sql = build_queries(self.inbox, connections[db])
        return self._sql

    def process_batch(self, worker: wk.Worker) -> int:
        self._maybe_run_retention(worker)
        db = worker.database
        spec = self.inbox
        done: list[int] = []
        failed: list[tuple] = []
        with transaction.atomic(using=db), connections[db].cursor() as cursor:
            q = self._queries(db)
            cursor.execute(
                q["claim"],
                {
                    "inbox": spec.name,
                    "limit": worker.batch_size,
                    "part": self.part,
                    "parts": self.parts,
                },
            )
            claimed = cursor.fetchall()
            attempts = dict(claimed)
            records = spec.model._default_manager.using(db).in_bulk(list(attempts))
            rows = []
            for pk in attempts:  # claim order
                record = records[pk]
                aggregate = (
                    None
                    if spec.aggregate_field is None
                    else str(getattr(record, spec.aggregate_field))
                )
                rows.append(
                    (
                        pk,
                        str(getattr(record, spec.id_field)),
                        str(getattr(record, spec.type_field)),
                        "",
                        aggregate,
                        record,
                        "",
                        attempts[pk],
                        None,
                    )
                )
            self._run(worker, rows, done, failed, ordered=False)
            by_pk = {row[0]: row for row in rows}
            if done:
                cursor.execute(q["ack"], {"pks": done})
                cursor.execute(
                    _ACK_RECORDS, {"inbox": spec.name, "message_ids": [by_pk[pk][1] for pk in done]}
                )
            if failed:
                pks, errs, delays, dead = zip(*failed, strict=True)
                cursor.execute(
                    _RECORD_FAILURES,
                    {
                        "inbox": spec.name,
                        "message_ids": [by_pk[pk][1] for pk in pks],
                        "types": [by_pk[pk][2] for pk in pks],
                        "aggregates": [by_pk[pk][4] for pk in pks],
                        "refs": [
                            json.dumps({"model": spec.model._meta.label, "pk": str(pk)})
                            for pk in pks
                        ],
                        "errors": list(errs),
                        "delays": list(delays),
                        "dead": list(dead),
                    },
                )
        worker.handled += len(done)
        return len(claimed)

    def _message(self, row: tuple) -> inbox.InboxMessage:
        pk, message_id, type_, source, aggregate_id, record, trace_id, attempts, _ = row
        return inbox.InboxMessage(
            id=pk,
            inbox=self.inbox.name,
            message_id=message_id,
            type=type_,
            source=source,
            aggregate_id=aggregate_id,
            payload=record,
            trace_id=trace_id,
            attempts=attempts,
            received_at=None,
        )

    def seconds_until_due(self, worker: wk.Worker) -> float | None:
        with connections[worker.database].cursor() as cursor:
            cursor.execute(
                self._queries(worker.database)["seconds_until_due"], {"inbox": self.inbox.name}
            )
            return cursor.fetchone()[0]


# A failure record is the pgmsg_inbox_message row of (inbox, message_id); its status says
# whether the model row may be claimed: pending and due, or (no record) never failed.
_RECORD_FAILURES = """
INSERT INTO pgmsg_inbox_message AS m (inbox, message_id, type, aggregate_id, payload, attempts,
                                      last_error, last_failed_at, status, available_at)
SELECT %(inbox)s, f.message_id, f.type, f.aggregate_id, f.ref::jsonb, 1, f.error, now(),
       CASE WHEN f.dead THEN 'dead' ELSE 'pending' END, now() + make_interval(secs => f.delay)
FROM unnest(%(message_ids)s::text[], %(types)s::text[], %(aggregates)s::text[],
            %(refs)s::text[], %(errors)s::text[], %(delays)s::float8[], %(dead)s::bool[])
     AS f(message_id, type, aggregate_id, ref, error, delay, dead)
ON CONFLICT (inbox, message_id) DO UPDATE
SET attempts = CASE WHEN m.status = 'pending' THEN m.attempts + 1 ELSE 1 END,
    last_error = EXCLUDED.last_error, last_failed_at = now(),
    status = EXCLUDED.status, available_at = EXCLUDED.available_at
"""
_ACK_RECORDS = """
UPDATE pgmsg_inbox_message SET status = 'processed', processed_at = now()
WHERE inbox = %(inbox)s AND message_id = ANY(%(message_ids)s::text[]) AND status = 'pending'
"""


def build_queries(spec: ModelInbox, connection) -> dict[str, str]:
    """The model inbox's statements, with its table and columns quoted as identifiers."""
    meta = spec.model._meta
    connection.ensure_connection()
    conn = connection.connection

    def ident(name: str) -> str:
        return pgsql.Identifier(name).as_string(conn)

    table = ident(meta.db_table)
    pk = ident(meta.pk.column)
    key = ident(meta.get_field(spec.id_field).column)
    mark_field = meta.get_field(spec.processed_field)
    mark = ident(mark_field.column)
    if isinstance(mark_field, models.BooleanField):
        unprocessed, set_mark = f"t.{mark} IS NOT TRUE", "true"
    else:
        unprocessed, set_mark = f"t.{mark} IS NULL", "now()"
    hashed = f"t.{key}::text"
    if spec.aggregate_field is not None:
        aggregate = ident(meta.get_field(spec.aggregate_field).column)
        hashed = f"coalesce(t.{aggregate}::text, {hashed})"
    # Not claimable: dead, discarded, or backing off after a failure.
    settled = (
        f"f.inbox = %(inbox)s AND f.message_id = t.{key}::text "
        "AND (f.status IN ('dead', 'discarded') "
        "OR (f.status = 'pending' AND f.available_at > now()))"
    )
    return {
        # Due unprocessed rows in primary-key order; rows another worker holds are skipped.
        "claim": f"""
            SELECT t.{pk}, CASE WHEN f.status = 'pending' THEN f.attempts ELSE 0 END
            FROM {table} AS t
            LEFT JOIN pgmsg_inbox_message AS f
                   ON f.inbox = %(inbox)s AND f.message_id = t.{key}::text
            WHERE {unprocessed}
              AND NOT EXISTS (SELECT FROM pgmsg_inbox_message AS f WHERE {settled})
              AND (%(parts)s = 1
                   OR mod(hashtext({hashed})::bigint & 2147483647, %(parts)s) = %(part)s)
            ORDER BY t.{pk}
            LIMIT %(limit)s
            FOR UPDATE OF t SKIP LOCKED""",
        "ack": f"UPDATE {table} SET {mark} = {set_mark} WHERE {pk} = ANY(%(pks)s)",
        "pending": f"""
            SELECT count(*) FROM {table} AS t
            WHERE {unprocessed}
              AND NOT EXISTS (SELECT FROM pgmsg_inbox_message AS f
                              WHERE f.inbox = %(inbox)s AND f.message_id = t.{key}::text
                                AND f.status IN ('dead', 'discarded'))""",
        "processed_last_minute": (
            f"SELECT count(*) FROM {table} AS t WHERE t.{mark} >= now() - interval '1 minute'"
            if set_mark == "now()"
            else "SELECT 0"
        ),
        "seconds_until_due": """
            SELECT EXTRACT(EPOCH FROM min(available_at) - now())::float8
            FROM pgmsg_inbox_message
            WHERE inbox = %(inbox)s AND status = 'pending' AND available_at > now()""",
    }


def counts(spec: ModelInbox) -> tuple[int, int]:
    """For health: unprocessed rows that are not dead or discarded, and rows processed in the
    last minute (0 when the processed mark is a boolean)."""
    connection = connections[conf.get().DATABASE]
    queries = build_queries(spec, connection)
    with connection.cursor() as cursor:
        cursor.execute(queries["pending"], {"inbox": spec.name})
        pending = cursor.fetchone()[0]
        cursor.execute(queries["processed_last_minute"])
        return pending, cursor.fetchone()[0]
