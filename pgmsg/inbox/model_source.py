"""The worker's source for a model inbox: the project's unprocessed rows are the messages."""

from __future__ import annotations

import dataclasses
import json

from django.db import connections, transaction

from pgmsg.core import batch, claims, sources, wire
from pgmsg.core.sources import Worker
from pgmsg.inbox import declarations as inbox
from pgmsg.inbox import model_inbox
from pgmsg.inbox.source import InboxSource, delivery_of, failure_params

#: pgmsg_claim.kind of model inbox rows, named there by claims.key(inbox name, primary key).
CLAIM_KIND = "model inbox"


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
        # Inside a caller's transaction, a rollback is the caller's, not a dead worker's.
        own_transaction = not connections[db].in_atomic_block
        outcome: batch.BatchResult[inbox.InboxMessage] = batch.BatchResult()
        with transaction.atomic(using=db), wire.LazyCursor(connections[db]) as cursor:
            # The claim opens the transaction (its BEGIN in the same round trip).
            (rows,) = wire.opening_rows(
                connections[db],
                self.queries["claim"],
                {
                    "inbox": self.inbox.name,
                    "limit": worker.batch_size,
                    "part": self.part,
                    "parts": self.parts,
                },
            )
            attempts = {pk: tries for pk, tries, _xid in rows}
            records = self.inbox.model._default_manager.using(db).in_bulk(list(attempts))
            messages = [self._message(records[pk], attempts[pk]) for pk in attempts]
            verdicts, suspect = [], None
            if messages and own_transaction:
                messages, verdicts, suspect = self._record(worker, messages, rows[0][-1])
            self._run(worker, messages, outcome)
            self._settle(cursor, outcome, verdicts)
            if suspect is not None and (
                verdicts
                or suspect in outcome.done
                or any(message is suspect for message, _ in outcome.failed)
            ):
                claims.forget(cursor, CLAIM_KIND, self._claim_key(suspect))
        worker.handled += len(outcome.done)
        # A batch narrowed to its suspect left the rest claimable: come back for them at once.
        return worker.batch_size if suspect is not None else len(rows)

    def _claim_key(self, message: inbox.InboxMessage) -> int:
        return claims.key(self.inbox.name, message.id)

    def _record(self, worker, messages, xid):
        """Record the batch's claim outside its transaction (pgmsg/core/claims.py); if some of
        its rows were in batches that died, keep only the first such suspect, alone.

        Returns (messages to run, [(message, dead Failure)], the suspect or None).
        """
        keys = [self._claim_key(m) for m in messages]
        crashes = claims.record_and_count(worker, CLAIM_KIND, keys, xid)
        if not crashes:
            return messages, [], None
        claimed = [
            claims.Claimed(k, delivery_of(m), self.inbox.max_attempts)
            for m, k in zip(messages, keys)
        ]
        guarded = claims.guard(worker, CLAIM_KIND, claimed, crashes, xid)
        if guarded.suspect is None:  # (every batch with suspects has one)
            return messages, [], None
        first = messages[guarded.suspect.index]
        suspect = dataclasses.replace(first, attempts=first.attempts + guarded.suspect.crashes)
        if guarded.suspect.verdict is not None:
            return [], [(suspect, guarded.suspect.verdict)], suspect
        return [suspect], [], suspect

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

    def _settle(self, cursor, outcome: batch.BatchResult[inbox.InboxMessage], verdicts) -> None:
        """Mark handled rows processed and record failures, in the claim transaction.

        ``verdicts``: (message, Failure) decided without running (a worker died too often)."""
        spec = self.inbox
        if outcome.done:
            cursor.execute(self.queries["ack"], {"pks": [m.id for m in outcome.done]})
            cursor.execute(
                self.queries["ack_records"],
                {"inbox": spec.name, "message_ids": [m.message_id for m in outcome.done]},
            )
        failures = [*verdicts, *((m, self._failure(m, exc)) for m, exc in outcome.failed)]
        if failures:
            params = failure_params(failures)
            failed = [message for message, _ in failures]
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
