"""The listen worker's source for an inbox: claim (ordered or not), handle, acknowledge, retry."""

from __future__ import annotations

import json
import logging
import math
import time

from django.db import connections, transaction

from pgmsg import conf, errors, sql
from pgmsg import worker as wk
from pgmsg.inbox import WAKE_PREFIX, Inbox, InboxMessage, registry

logger = logging.getLogger(__name__)

_SQL = sql.load("inbox.sql")

# Errors that retrying cannot mend: the message goes straight to the dead letters.


class InboxSource:
    """One inbox, drained by the listen worker (see pgmsg/worker.py for the loop)."""

    def __init__(self, inbox: Inbox, partition: tuple[int, int] | None = None) -> None:
        self.inbox = inbox
        self.label = WAKE_PREFIX + inbox.name
        self.part, self.parts = partition or (0, 1)
        if self.parts > 1:
            self.label += f" (share {self.part}/{self.parts})"
        self._wake = WAKE_PREFIX + inbox.name
        self._types = list(inbox.priorities)
        self._priorities = [inbox.priorities[t] for t in self._types]
        self._next_retention = 0.0

    def wants(self, wake_payload: str) -> bool:
        return wake_payload == self._wake

    def seconds_until_due(self, worker: wk.Worker) -> float | None:
        with connections[worker.database].cursor() as cursor:
            cursor.execute(_SQL["seconds_until_due"], {"inbox": self.inbox.name})
            return cursor.fetchone()[0]

    def process_batch(self, worker: wk.Worker) -> int:
        self._maybe_run_retention(worker)
        db = worker.database
        params = {
            "inbox": self.inbox.name,
            "types": self._types,
            "priorities": self._priorities,
            "part": self.part,
            "parts": self.parts,
        }
        done: list[int] = []
        failed: list[tuple] = []
        with transaction.atomic(using=db), connections[db].cursor() as cursor:
            claimed, more = 0, False
            if self.inbox.ordered:
                claimed, more = self._ordered(worker, cursor, params, done, failed)
            # Messages without an aggregate id (in an ordered inbox too) have no order to keep;
            # a quarter batch is kept for them so that a backlog of aggregates cannot starve them.
            room = max(worker.batch_size - claimed, math.ceil(worker.batch_size / 4))
            if not worker.stopping:
                claim = "claim_unordered" if self._types else "claim_unordered_fifo"
                cursor.execute(
                    _SQL[claim],
                    {**params, "limit": room, "null_aggregate_only": self.inbox.ordered},
                )
                rows = cursor.fetchall()
                claimed += len(rows)
                self._run(worker, rows, done, failed, ordered=False)
            if done:
                cursor.execute(_SQL["ack"], {"ids": done})
            if failed:
                ids, errs, delays, dead = zip(*failed, strict=True)
                cursor.execute(
                    _SQL["fail"],
                    {
                        "ids": list(ids),
                        "errors": list(errs),
                        "delays": list(delays),
                        "dead": list(dead),
                    },
                )
        worker.handled += len(done)
        return worker.batch_size if more else claimed

    def _ordered(self, worker, cursor, params, done, failed) -> tuple[int, bool]:
        """Handle the heads (and what follows) of aggregates that no other worker holds.

        Returns the rows claimed, and whether a locked aggregate may have more due now.
        """
        # Take a quarter batch of aggregates, up to four messages each (more when fewer are
        # free), so that other workers find aggregates to take too; look past the first
        # heads so that they can find the ones this worker does not hold.
        cursor.execute(_SQL["ordered_heads"], {**params, "limit": 4 * worker.batch_size})
        heads = [row[0] for row in cursor.fetchall()]
        if not heads:
            return 0, False
        lock_limit = math.ceil(worker.batch_size / 4)
        cursor.execute(
            _SQL["lock_aggregates"],
            {"inbox": self.inbox.name, "aggregates": heads, "limit": lock_limit},
        )
        mine = [row[0] for row in cursor.fetchall()]
        if not mine:
            return 0, False
        # Due aggregates left for lack of room (not because another worker holds them).
        more = len(mine) == lock_limit and len(heads) > lock_limit
        per_aggregate = max(1, math.ceil(worker.batch_size / len(mine)))
        cursor.execute(
            _SQL["claim_ordered"],
            {"inbox": self.inbox.name, "aggregates": mine, "per_aggregate": per_aggregate},
        )
        rows = cursor.fetchall()
        # Per aggregate, what may run now: the messages before the first dead or backing-off one.
        runnable, stopped, fetched = [], set(), {}
        for *row, status, due in rows:
            aggregate = row[4]
            fetched[aggregate] = fetched.get(aggregate, 0) + 1
            if aggregate in stopped or status != "pending" or not due:
                stopped.add(aggregate)
            else:
                runnable.append(row)
        self._run(worker, runnable, done, failed, ordered=True)
        more = more or any(n >= per_aggregate for a, n in fetched.items() if a not in stopped)
        return len(rows), more

    def _run(self, worker, rows: list, done: list, failed: list, *, ordered: bool) -> None:
        """Run the rows' handlers in order, inside the claim transaction (worker.run_batch);
        in an ordered inbox a failure holds back the rest of its aggregate."""
        done.extend(
            wk.run_batch(
                worker,
                rows,
                self._prepare,
                failed.append,
                group=(lambda row: row[4]) if ordered else None,
            )
        )

    def _prepare(self, row: tuple):
        id_, message_id, type_, attempts = row[0], row[1], row[2], row[7]
        return (
            wk.Delivery("inbox", id_, self.inbox.name, attempts),
            lambda: self._call(type_, row),
            lambda exc: self._failure(id_, message_id, attempts, exc),
        )

    def _call(self, type_: str, row: tuple) -> None:
        func = registry.handlers.get((self.inbox.name, type_))
        if func is None:
            raise errors.UnknownMessageType(
                f"inbox {self.inbox.name!r} has no handler for message type {type_!r}; "
                f"handled types: {registry.types(self.inbox.name)}"
            )
        func(self._message(row))

    def _message(self, row: tuple) -> InboxMessage:
        (id_, message_id, type_, source, aggregate_id, text, trace_id, attempts, received_at) = row
        return InboxMessage(
            id=id_,
            inbox=self.inbox.name,
            message_id=message_id,
            type=type_,
            source=source,
            aggregate_id=aggregate_id,
            payload=json.loads(text),
            trace_id=trace_id,
            attempts=attempts,
            received_at=received_at,
        )

    def _failure(self, id_: int, message_id: str, attempts: int, exc: Exception) -> tuple:
        max_attempts = self.inbox.max_attempts or conf.get().MAX_ATTEMPTS
        dead, text = wk.failure_outcome(exc, attempts, max_attempts)
        logger.warning(
            "pgmsg: inbox %r message %r failed (attempt %s%s): %s",
            self.inbox.name,
            message_id,
            attempts + 1,
            ", now dead" if dead else "",
            exc,
        )
        return id_, text, 0.0 if dead else wk.retry_delay(attempts), dead

    def _maybe_run_retention(self, worker: wk.Worker) -> None:
        now = time.monotonic()
        if now < self._next_retention:
            return
        self._next_retention = now + conf.get().INBOX_RETENTION_INTERVAL
        from pgmsg import inbox_ops

        inbox_ops.purge([self.inbox.name], chunks=1)
