"""The worker's source for an inbox: claim (ordered or not), handle, acknowledge, retry."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import time
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone

from pgmsg.core import batch, claims, conf, errors, horizon, locks, payloads, sources, sql, wire
from pgmsg.core.claim_start import ClaimStart
from pgmsg.core.sources import Worker
from pgmsg.inbox import declarations as inbox
from pgmsg.inbox import operations, retention

QUERIES = sql.load(__package__, "inbox.sql")


#: Most seconds a worker claims past its last batch before reading from the start again
#: (as the notification claim does: pgmsg/channels/source.py).
FROM_START_INTERVAL = 1.0
#: First and longest pause while an ordered head waits only for the read horizon.
HORIZON_POLL_FIRST = 0.005
HORIZON_POLL_MAX = 0.5
#: In a claim row: received_at, as microseconds since the epoch.
RECEIVED_US = 8
#: What those microseconds count from (exact arithmetic, where fromtimestamp rounds a float).
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def message_from_row(inbox_name: str, row: tuple, *, naive: bool) -> inbox.InboxMessage:
    """An InboxMessage from a claim row (the columns every claim query returns, in order;
    received_at as microseconds since the epoch, as the event store reads its times).
    ``naive``: not settings.USE_TZ (read once per batch: Django's settings are a lazy object)."""
    id_, message_id, type_, source, aggregate_id, text, trace_id, attempts, received_us = row
    # Exact to the microsecond (see RecordedEvent.from_rows); naive where Django is.
    received_at = dt.datetime.fromtimestamp(received_us / 1e6, dt.UTC)
    if naive:
        received_at = timezone.make_naive(received_at)
    return inbox.InboxMessage(
        id=id_,
        inbox=inbox_name,
        message_id=message_id,
        type=type_,
        source=source,
        aggregate_id=aggregate_id,
        payload=payloads.from_jsonb(text),
        trace_id=trace_id,
        attempts=attempts,
        received_at=received_at,
    )


class InboxSource:
    """One inbox, drained by the listen worker (see pgmsg/core/worker.py for the loop)."""

    def __init__(self, spec: inbox.Inbox, partition: tuple[int, int] | None = None) -> None:
        self.inbox = spec
        self.label = inbox.WAKE_PREFIX + spec.name
        self.part, self.parts = partition or (0, 1)
        if self.parts > 1:
            self.label += f" (share {self.part}/{self.parts})"
        self._wake = inbox.WAKE_PREFIX + spec.name
        self.wake_payloads = [self._wake]
        self._types = list(spec.priorities)
        self._priorities = [spec.priorities[t] for t in self._types]
        #: The map's types by priority level, lowest number first (claim_types).
        self._levels = [
            sorted(t for t in self._types if spec.priorities[t] == level)
            for level in sorted(set(self._priorities))
        ]
        self._next_retention = 0.0
        #: Where the next arrival-order claim starts (core/claim_start.py).
        self._start = ClaimStart(FROM_START_INTERVAL)
        self._horizon_poll = HORIZON_POLL_FIRST
        self._horizon_look_at: float | None = None
        #: The horizon of the last ordered claim: heads at or above it were not claimable then.
        self._claim_horizon: int | None = None

    def wants(self, wake_payload: str) -> bool:
        return wake_payload == self._wake

    def seconds_until_due(self, worker: Worker) -> float | None:
        due = sources.query_value(worker, QUERIES["seconds_until_due"], {"inbox": self.inbox.name})
        if not (self.inbox.ordered and self._held_by_the_horizon(worker)):
            was_held = self._horizon_poll != HORIZON_POLL_FIRST
            self._horizon_poll, self._horizon_look_at = HORIZON_POLL_FIRST, None
            return 0.0 if was_held else due  # the horizon passed a head since the last look
        # A head waits only for the read horizon: for a transaction that was open at this
        # worker's last look (another worker's batch, a session writing nothing here) and
        # whose end sends no wake-up. Due again soon (0: look now), less often while it lasts.
        now = time.monotonic()
        if self._horizon_look_at is None:
            # The poll itself, not (now + poll) - now, which floats can make a hair longer.
            wait = self._horizon_poll
            self._horizon_look_at = now + wait
            self._horizon_poll = min(self._horizon_poll * 2, HORIZON_POLL_MAX)
        else:
            wait = max(self._horizon_look_at - now, 0.0)
        if wait == 0.0:
            self._horizon_look_at = None  # this look is due; the next is set after it
        return wait if due is None else min(due, wait)

    def _held_by_the_horizon(self, worker: Worker) -> bool:
        """Whether a head was held back by the horizon at the last claim (or came after it).
        Measured against the claim's horizon, not a fresh one: a transaction that held a head
        back and ended between the claim and this look leaves the head claimable, and a fresh
        horizon would call it free and the worker would sleep until its sweep (bench/bridges.py
        saw this: RabbitMQ's relay commits after the bridge has stored the message)."""
        with connections[worker.database].cursor() as cursor:
            claimed_below = self._claim_horizon
            params = {
                "inbox": self.inbox.name,
                "types": self._types,
                "priorities": self._priorities,
                "part": self.part,
                "parts": self.parts,
                "horizon": horizon.horizon(cursor) if claimed_below is None else claimed_below,
                "below": False,
                "limit": 1,
            }
            cursor.execute(QUERIES["ordered_heads"], params)
            return cursor.fetchone() is not None

    def process_batch(self, worker: Worker) -> int:
        self._maybe_run_retention(worker)
        db = worker.database
        # Inside a caller's transaction, a rollback is the caller's, not a dead worker's.
        own_transaction = not connections[db].in_atomic_block
        params = {
            "inbox": self.inbox.name,
            "types": self._types,
            "priorities": self._priorities,
            "part": self.part,
            "parts": self.parts,
        }
        outcome: batch.BatchResult[inbox.InboxMessage] = batch.BatchResult()
        with transaction.atomic(using=db), wire.LazyCursor(connections[db]) as cursor:
            ordered, unordered, claimed, more, xid, received = self._claim(
                worker, connections[db], cursor, params
            )
            verdicts, suspect = [], None
            claimed_unordered = {m.id for m in unordered}
            if (ordered or unordered) and own_transaction:
                ordered, unordered, verdicts, suspect = self._record(
                    worker, cursor, ordered, unordered, xid
                )
            self._run_claimed(worker, ordered, unordered, outcome, claimed_unordered)
            self._settle(cursor, outcome, verdicts, received)
            if claimed_unordered - {m.id for m in outcome.done}:
                self._start.from_start()  # failed or left: pending again below its start
            if suspect is not None and (
                verdicts
                or suspect in outcome.done
                or any(message is suspect for message, _ in outcome.failed)
            ):
                claims.forget(cursor, "inbox", suspect.id)
        worker.handled += len(outcome.done)
        return worker.batch_size if more or suspect is not None else claimed

    def _claim(self, worker: Worker, connection, cursor, params: dict[str, Any]):
        """Claim a batch: an ordered inbox's aggregates first, then messages of no aggregate.
        Returns (ordered, unordered, count claimed, whether more is waiting, the claim's
        transaction id, the rows' receipt times for the ack)."""
        ordered, unordered, claimed, more, xid = [], [], 0, False, None
        received: list[int] = []
        if self.inbox.ordered:
            ordered, claimed, more, xid = self._claim_ordered(worker, cursor, params, received)
        # Messages without an aggregate id (in an ordered inbox too) have no order to keep;
        # a quarter batch is kept for them so that a backlog of aggregates cannot starve them.
        room = max(worker.batch_size - claimed, math.ceil(worker.batch_size / 4))
        if not worker.stopping:
            rows = self._claim_unordered(connection, cursor, params, room)
            claimed += len(rows)
            received += [r[RECEIVED_US] for r in rows]
            naive = not settings.USE_TZ
            unordered = [message_from_row(self.inbox.name, r[:-1], naive=naive) for r in rows]
            xid = rows[0][-1] if rows else xid
        return ordered, unordered, claimed, more, xid, received

    def _run_claimed(self, worker: Worker, ordered, unordered, outcome, claimed_unordered) -> None:
        try:
            # A failure holds back the rest of its aggregate.
            self._run(worker, ordered, outcome, group=lambda message: message.aggregate_id)
            if not worker.stopping:
                self._run(worker, unordered, outcome)
        except batch.Redo:
            # Rolled back for a handler's failure: the claim with a savepoint per message
            # (Worker.process) must take these messages again, not the ones past them.
            if claimed_unordered:
                self._start.again_from(min(claimed_unordered))
            raise

    def _claim_unordered(
        self, connection, cursor, params: dict[str, Any], limit: int
    ) -> list[tuple]:
        """Claim up to ``limit`` messages outside any aggregate's order: the priority map's
        levels, lowest number first, each in arrival order (claim_types), while the batch
        has room, then the types of no level in arrival order (_claim_in_arrival_order).
        Unless the ordered claim came first, the first statement opens the transaction (its
        BEGIN in the same round trip)."""
        params = {**params, "null_aggregate_only": self.inbox.ordered}
        rows: list[tuple] = []
        for types in self._levels:
            (level,) = wire.opening_rows(
                connection,
                QUERIES["claim_types"],
                {**params, "types": types, "limit": limit - len(rows)},
                varying=("limit",),
            )
            rows += level
            if len(rows) >= limit:
                return rows
        return rows + self._claim_in_arrival_order(connection, cursor, params, limit - len(rows))

    def _claim_in_arrival_order(
        self, connection, cursor, params: dict[str, Any], limit: int
    ) -> list[tuple]:
        """Claim up to ``limit`` messages of the types the priority map leaves out (every type
        without a map), sorted by id: past the last batch while batches come back full
        (claim_unordered_fifo), from the start when that finds too few, after a batch came
        back short or left messages pending, and at least every FROM_START_INTERVAL, so that
        none below is left behind (retries come due there, and a late commit or another
        worker's rollback puts messages there)."""
        from_id = self._start.next()
        params = {**params, "limit": limit, "mapped": self._types, "from_id": from_id}
        # Prepared, as the notification claim (its plan does not look at from_id, a
        # sub-select), where no priority level came first: the limit, written in, is then
        # always the batch size (after levels it varies: bound as text, as before).
        (rows,) = wire.opening_rows(
            connection,
            QUERIES["claim_unordered_fifo"],
            params,
            varying=("from_id", "limit") if self._levels else ("from_id",),
            prepare=not self._levels,
        )
        if len(rows) < limit and from_id:
            # The rows just claimed are still pending to this transaction (locked, not yet
            # acknowledged): where the read from the start reaches them, they are left out.
            taken = {row[0] for row in rows}
            cursor.execute(
                QUERIES["claim_unordered_fifo"],
                {**params, "limit": limit - len(rows), "from_id": 0},
            )
            rows = sorted(rows + [row for row in cursor.fetchall() if row[0] not in taken])
        self._start.claimed(rows, limit)
        return rows

    def _record(self, worker, cursor, ordered, unordered, xid):
        """Record the batch's claim outside its transaction (see pgmsg/core/claims.py); if
        some of its messages were in batches that died, keep only one suspect, alone.

        Returns (ordered to run, unordered to run, [(message, dead Failure)], the suspect).
        """
        messages = ordered + unordered
        crashes = claims.record_and_count(worker, "inbox", [m.id for m in messages], xid)
        if not crashes:
            return ordered, unordered, [], None

        def lead(index: int) -> int:  # an ordered message's aggregate's first goes first
            if index >= len(ordered):
                return index
            aggregate = ordered[index].aggregate_id
            return next(i for i, m in enumerate(ordered) if m.aggregate_id == aggregate)

        claimed = [claims.Claimed(m.id, delivery_of(m), self.inbox.max_attempts) for m in messages]
        guarded = claims.guard(worker, "inbox", claimed, crashes, xid, lead=lead)
        if guarded.suspect is None:  # (every batch with suspects has one)
            return ordered, unordered, [], None
        first = messages[guarded.suspect.index]
        suspect = dataclasses.replace(first, attempts=first.attempts + guarded.suspect.crashes)
        if guarded.suspect.verdict is not None:
            return [], [], [(suspect, guarded.suspect.verdict)], suspect
        if guarded.suspect.index < len(ordered):
            return [suspect], [], [], suspect
        return [], [suspect], [], suspect

    def _claim_ordered(self, worker, cursor, params, received: list[int]):
        """Claim the heads (and what follows) of aggregates that no other worker holds; their
        receipt times go to ``received``.

        Returns (messages that may run now, in order; rows claimed; whether a locked
        aggregate may have more due now; this transaction's id or None).
        """
        # Take a quarter batch of aggregates, up to four messages each (more when fewer are
        # free), so that other workers find aggregates to take too; look past the first
        # heads so that they can find the ones this worker does not hold.
        # First, in its own statement: messages below the horizon are visible to the later ones.
        params = {**params, "horizon": horizon.horizon(cursor), "below": True}
        self._claim_horizon = params["horizon"]
        cursor.execute(QUERIES["ordered_heads"], {**params, "limit": 4 * worker.batch_size})
        heads = [row[0] for row in cursor.fetchall()]
        if not heads:
            return [], 0, False, None
        lock_limit = math.ceil(worker.batch_size / 4)
        cursor.execute(
            QUERIES["lock_aggregates"],
            {
                "inbox": self.inbox.name,
                "lock_space": locks.INBOX,
                "aggregates": heads,
                "limit": lock_limit,
            },
        )
        mine = [row[0] for row in cursor.fetchall()]
        if not mine:
            return [], 0, False, None
        # Due aggregates left for lack of room (not because another worker holds them).
        more = len(mine) == lock_limit and len(heads) > lock_limit
        per_aggregate = max(1, math.ceil(worker.batch_size / len(mine)))
        cursor.execute(
            QUERIES["claim_ordered"],
            {
                "inbox": self.inbox.name,
                "aggregates": mine,
                "per_aggregate": per_aggregate,
                "horizon": params["horizon"],
            },
        )
        rows = cursor.fetchall()
        # Per aggregate, what may run now: the messages before the first dead or backing-off one.
        runnable, stopped, fetched = [], set(), {}
        naive = not settings.USE_TZ
        for *row, status, due, _xid in rows:
            received.append(row[RECEIVED_US])
            message = message_from_row(self.inbox.name, row, naive=naive)
            aggregate = message.aggregate_id
            fetched[aggregate] = fetched.get(aggregate, 0) + 1
            if aggregate in stopped or status != "pending" or not due:
                stopped.add(aggregate)
            else:
                runnable.append(message)
        more = more or any(n >= per_aggregate for a, n in fetched.items() if a not in stopped)
        return runnable, len(rows), more, rows[-1][-1] if rows else None

    def _run(self, worker, messages, outcome, *, group=None) -> None:
        result = batch.run_batch(
            worker, messages, delivery=delivery_of, handle=self._call, group=group
        )
        outcome.done.extend(result.done)
        outcome.failed.extend(result.failed)

    def _call(self, message: inbox.InboxMessage) -> None:
        func = inbox.registry.handlers.get((self.inbox.name, message.type))
        if func is None:
            raise errors.UnknownMessageType(
                f"inbox {self.inbox.name!r} has no handler for message type {message.type!r}; "
                f"handled types: {inbox.registry.types(self.inbox.name)}"
            )
        func(message)

    def _failure(self, message: inbox.InboxMessage, exc: Exception) -> batch.Failure:
        return batch.failure(delivery_of(message), exc, max_attempts=self.inbox.max_attempts)

    def _settle(
        self, cursor, outcome: batch.BatchResult[inbox.InboxMessage], verdicts, received
    ) -> None:
        """Acknowledge what was handled and record what failed, in the claim transaction.

        ``verdicts``: (message, Failure) decided without running (a worker died too often).
        ``received``: the receipt times of every row claimed (microseconds since the epoch):
        the ack names the weeks they lie in, so that the server plans and scans only those
        partitions of the table."""
        if outcome.done:
            cursor.execute(
                QUERIES["ack"],
                {
                    "ids": [m.id for m in outcome.done],
                    "oldest": _EPOCH + dt.timedelta(microseconds=min(received)),
                    "newest": _EPOCH + dt.timedelta(microseconds=max(received)),
                },
            )
        failures = [*verdicts, *((m, self._failure(m, exc)) for m, exc in outcome.failed)]
        if failures:
            cursor.execute(QUERIES["fail"], failure_params(failures))

    def _maybe_run_retention(self, worker: Worker) -> None:
        now = time.monotonic()
        if now < self._next_retention:
            return
        self._next_retention = now + conf.get().INBOX_RETENTION_INTERVAL
        # Partitions are shared by every inbox: the worker's first inbox source looks after
        # them (partitions ahead, expired ones dropped), the others only after their dead rows.
        if self is next(s for s in worker.sources if isinstance(s, InboxSource)):
            retention.maintain()
        operations.purge([self.inbox.name], chunks=1, by_partition=False)


def failure_params(failures: list[tuple[inbox.InboxMessage, batch.Failure]]) -> dict[str, Any]:
    """Parameters of a fail statement for (message, Failure) pairs."""
    return {
        "ids": [m.id for m, _ in failures],
        "errors": [f.error for _, f in failures],
        "delays": [f.retry_in for _, f in failures],
        "dead": [f.give_up for _, f in failures],
    }


def delivery_of(message: inbox.InboxMessage) -> batch.Delivery:
    return batch.Delivery("inbox", message.id, message.inbox, message.attempts)
