"""The worker's source for a model inbox: the project's unprocessed rows are the messages."""

from __future__ import annotations

import json

from django.db import connections, transaction

from pgmsg.core import batch, sources
from pgmsg.core.sources import Worker
from pgmsg.inbox import declarations as inbox
from pgmsg.inbox import model_inbox
from pgmsg.inbox.source import InboxSource


class ModelInboxSource(InboxSource):
    """Drains a model inbox: unprocessed rows without a dead, discarded or backing-off record."""

    inbox: model_inbox.ModelInbox

    def __init__(
        self, spec: model_inbox.ModelInbox, partition: tuple[int, int] | None = None
    ) -> None:
        super().__init__(spec, partition)
        self._queries: dict | None = None

    @property
    def queries(self) -> dict:
        if self._queries is None:
            self._queries = model_inbox.queries(self.inbox)
        return self._queries

    def process_batch(self, worker: Worker) -> int:
        self._maybe_run_retention(worker)
        db = worker.database
        outcome: batch.BatchResult[inbox.InboxMessage] = batch.BatchResult()
        with transaction.atomic(using=db), connections[db].cursor() as cursor:
            cursor.execute(
                self.queries["claim"],
                {
                    "inbox": self.inbox.name,
                    "limit": worker.batch_size,
                    "part": self.part,
                    "parts": self.parts,
                },
            )
            attempts = dict(cursor.fetchall())
            records = self.inbox.model._default_manager.using(db).in_bulk(list(attempts))
            messages = [self._message(records[pk], attempts[pk]) for pk in attempts]
            self._run(worker, messages, outcome)
            self._settle(cursor, outcome)
        worker.handled += len(outcome.done)
        return len(attempts)

    def _message(self, record, attempts: int) -> inbox.InboxMessage:
        spec = self.inbox
        aggregate = spec.aggregate_field and getattr(record, spec.aggregate_field)
        return inbox.InboxMessage(
            id=record.pk,
            inbox=spec.name,
            message_id=str(getattr(record, spec.id_field)),
            type=str(getattr(record, spec.type_field)),
            source="",
            aggregate_id=None if aggregate is None else str(aggregate),
            payload=record,
            trace_id="",
            attempts=attempts,
            received_at=None,
        )

    def _settle(self, cursor, outcome: batch.BatchResult[inbox.InboxMessage]) -> None:
        spec = self.inbox
        if outcome.done:
            cursor.execute(self.queries["ack"], {"pks": [m.id for m in outcome.done]})
            cursor.execute(
                self.queries["ack_records"],
                {"inbox": spec.name, "message_ids": [m.message_id for m in outcome.done]},
            )
        if outcome.failed:
            params = self._failure_params(outcome.failed)
            failed = [message for message, _ in outcome.failed]
            cursor.execute(
                self.queries["record_failures"],
                {
                    "inbox": spec.name,
                    "message_ids": [m.message_id for m in failed],
                    "types": [m.type for m in failed],
                    "aggregates": [m.aggregate_id for m in failed],
                    "refs": [
                        json.dumps({"model": spec.model._meta.label, "pk": str(m.id)})
                        for m in failed
                    ],
                    "errors": params["errors"],
                    "delays": params["delays"],
                    "dead": params["dead"],
                },
            )

    def seconds_until_due(self, worker: Worker) -> float | None:
        return sources.query_value(
            worker, self.queries["seconds_until_due"], {"inbox": self.inbox.name}
        )
