"""Inbox over a project's own model: its rows are the messages, one of its fields the mark."""

from __future__ import annotations

import dataclasses
from typing import Any

import pgtrigger
from django.db import connections, models
from psycopg import sql as pgsql

from pgmsg.core import conf, errors, names, sql, wake
from pgmsg.inbox import declarations as inbox


def wake_trigger(inbox_name: str, *, name: str = "pgmsg_inbox_wake") -> pgtrigger.Trigger:
    """A statement trigger for a model inbox's table: wake an idle worker on INSERT.

    Put it in the model's ``Meta.triggers``; without it, workers find new rows at the next
    sweep (PGMSG SWEEP_INTERVAL) instead of at commit.
    """
    names.validate_name(inbox_name, kind="inbox")  # safe as a literal below
    return pgtrigger.Trigger(
        name=name,
        level=pgtrigger.Statement,
        when=pgtrigger.After,
        operation=pgtrigger.Insert,
        # NOTIFYs only while a worker for this inbox is idle (pgmsg/core/wake.py).
        func="PERFORM " + wake.wake_sql(f"'{inbox.WAKE_PREFIX}{inbox_name}'") + "; RETURN NULL;",
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


QUERIES = sql.load(__package__, "model_inbox.sql")


def missing_claim_index(spec: ModelInbox) -> str | None:
    """The index to add where the model has none that the claim can read, else None.

    The claim reads unprocessed rows in primary-key order; without a partial index on the
    primary key over the unprocessed rows it reads the primary key's index from its start,
    over every processed row, on every claim and every idle look (15 to 25 ms a claim with
    200,000 processed rows, 0.26 ms with the index: docs/inbox.md). The claim writes its
    condition as Django writes the condition asked for here (model_inbox.sql)."""
    meta = spec.model._meta
    mark = meta.get_field(spec.processed_field)
    name = spec.processed_field
    if not isinstance(mark, models.BooleanField):
        wanted = [models.Q(**{f"{name}__isnull": True})]
        condition = f"models.Q({name}__isnull=True)"
    elif not mark.null:
        wanted = [models.Q(**{name: False})]
        condition = f"models.Q({name}=False)"
    else:
        null, false = models.Q(**{f"{name}__isnull": True}), models.Q(**{name: False})
        wanted = [null | false, false | null]
        condition = f"models.Q({name}__isnull=True) | models.Q({name}=False)"
    for index in meta.indexes:
        if index.condition in wanted and index.fields[:1] in ([meta.pk.name], ["pk"]):
            return None
    return (
        f'models.Index(fields=["{meta.pk.name}"], condition={condition}, '
        f'name="{meta.db_table[:18]}_unprocessed")'
    )


def queries(spec: ModelInbox) -> dict[str, pgsql.Composed | str]:
    """The model inbox's statements, with its table and columns filled in as identifiers."""
    meta = spec.model._meta
    mark_field = meta.get_field(spec.processed_field)
    boolean = isinstance(mark_field, models.BooleanField)
    idents = {
        "table": pgsql.Identifier(meta.db_table),
        "pk": pgsql.Identifier(meta.pk.column),
        "key": pgsql.Identifier(meta.get_field(spec.id_field).column),
        "mark": pgsql.Identifier(mark_field.column),
    }
    if spec.aggregate_field is not None:
        idents["aggregate"] = pgsql.Identifier(meta.get_field(spec.aggregate_field).column)

    def compose(name: str, **parts: pgsql.Composable) -> pgsql.Composed:
        return pgsql.SQL(QUERIES[name]).format(**idents, **parts)

    unprocessed = "unprocessed_null"
    if boolean:
        unprocessed = "unprocessed_false_or_null" if mark_field.null else "unprocessed_false"
    fragments = {
        "unprocessed": compose(unprocessed),
        "set_mark": compose("mark_true" if boolean else "mark_now"),
        "partition_key": compose(
            "partition_by_key" if spec.aggregate_field is None else "partition_by_aggregate"
        ),
    }
    found: dict[str, pgsql.Composed | str] = {
        name: compose(name, **fragments) for name in ("claim", "ack", "pending")
    }
    if not boolean:  # a boolean mark cannot tell when: counts() says 0 without asking
        found["processed_last_minute"] = compose("processed_last_minute")
    for name in ("record_failures", "ack_records", "seconds_until_due"):
        found[name] = QUERIES[name]
    return found


def counts(spec: ModelInbox) -> tuple[int, int]:
    """For health: unprocessed rows that are not dead or discarded, and rows processed in the
    last minute (0 when the processed mark is a boolean)."""
    statements = queries(spec)
    with connections[conf.get().DATABASE].cursor() as cursor:
        cursor.execute(statements["pending"], {"inbox": spec.name})
        pending = cursor.fetchone()[0]
        if "processed_last_minute" not in statements:
            return pending, 0
        cursor.execute(statements["processed_last_minute"])
        return pending, cursor.fetchone()[0]
