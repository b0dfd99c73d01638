"""The worker's sources for channels: stored notifications (exactly-once) and broadcasts."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from django.db import connections, transaction

from pgmsg.channels import declarations as channels
from pgmsg.channels import triggers
from pgmsg.core import batch, claims, errors, locks, payloads, sources, sql, wire
from pgmsg.core import worker as worker_module
from pgmsg.core.claim_start import ClaimStart
from pgmsg.core.sources import Worker

logger = logging.getLogger(__name__)

QUERIES = sql.load(__package__, "notifications.sql")


class ClaimedNotification(NamedTuple):
    """A row of ``claim_notifications``, in its column order."""

    id: int
    channel: str
    payload: str
    attempts: int
    # Kept as text: they are only written back when the row is restored.
    available_at: str
    created_at: str
    last_error: str | None
    last_failed_at: str | None
    #: The id of the transaction that claimed it.
    claimed_in: int
    #: Whether a claim of notifications whose batch died was on record when it was claimed:
    #: only then do the handlers wait for the batch's claim record (core/claims.py).
    crash_on_record: bool = False


#: Columns of a claimed row: the claiming transaction's id, and whether a crash was on record.
CLAIMED_IN = ClaimedNotification._fields.index("claimed_in")
CRASH_ON_RECORD = ClaimedNotification._fields.index("crash_on_record")

#: The wake payload of a row inserted without pgmsg_send() (an SQL producer's INSERT, a trigger
#: channel, the ORM): created_at's default (channels/functions.sql) cannot see the row's
#: channel, so it wakes the workers of every stored channel. No channel name has a colon
#: (core/names.py).
ANY_CHANNEL_WAKE = "channels:*"

#: Seconds between a worker's looks for rows of channels nobody declares (and its warning).
UNDECLARED_CHECK_INTERVAL = 300.0
#: Least seconds between a worker's looks at the claim's plan (after full batches).
STATISTICS_CHECK_INTERVAL = 1.0
#: Most seconds a worker claims past its last batch before reading from the start again.
FROM_START_INTERVAL = 1.0


class NotificationSource:
    """Stored notifications of the exactly-once channels that have listeners here."""

    label = "notifications"
    _next_undeclared_check = 0.0
    _next_statistics_check = 0.0
    #: Off once the claim's plan sorted even after an ANALYZE (see refresh_statistics).
    _refresh_statistics = True

    def __init__(self, names: Iterable[str]) -> None:
        self.names = sorted(names)
        # Each channel's own (pgmsg_send), and every stored channel's: what a row inserted
        # without pgmsg_send() wakes (functions.sql: created_at's default cannot see the
        # row's channel).
        self.wake_payloads = [*self.names, ANY_CHANNEL_WAKE]
        self._listeners = {name: list(channels.registry.listeners[name]) for name in self.names}
        self._specs = {name: channels.registry.get(name) for name in self.names}
        #: Per channel: payload text -> the listeners' argument (one call a message).
        self._decoders = {name: _decoder(spec) for name, spec in self._specs.items()}
        #: Past the last full batch while batches come back full (core/claim_start.py).
        self._start = ClaimStart(FROM_START_INTERVAL)
        #: The running batch's messages by row id, decoded while its claim record travelled
        #: (or _Undecodable); empty between batches.
        self._decoded: dict[int, object] = {}

    def wants(self, wake_payload: str) -> bool:
        return wake_payload in self._listeners or wake_payload == ANY_CHANNEL_WAKE

    def process_batch(self, worker: Worker) -> int:
        db = worker.database
        if time.monotonic() >= self._next_undeclared_check:
            self._next_undeclared_check = time.monotonic() + UNDECLARED_CHECK_INTERVAL
            warn_undeclared(db)
        # Inside a caller's transaction, a rollback is the caller's, not a dead worker's.
        connection = connections[db]
        own_transaction = not connection.in_atomic_block
        # The batch's claim record, once sent, is answered after the COMMIT (the stack's exit).
        with (
            contextlib.ExitStack() as after_commit,
            transaction.atomic(using=db),
            wire.LazyCursor(connection) as cursor,
        ):
            fetched = self._claim(connection, cursor, worker.batch_size)
            if not fetched:
                return 0
            crashes: dict[int, int] = {}
            if own_transaction:
                # The claim record travels while the rows are unpacked and their payloads
                # decoded (claims.send_record), and while they run when no crash is on record;
                # a payload that does not decode fails its row when the row runs, as decoding
                # it there would.
                ids, xid = [row[0] for row in fetched], fetched[0][CLAIMED_IN]
                record = after_commit.enter_context(
                    claims.send_record(worker, "notification", ids, xid)
                )
                rows = list(map(ClaimedNotification._make, fetched))
                self._decoded = self._decode_all(rows)
                if fetched[0][CRASH_ON_RECORD]:  # the claim's sub-select: one value for all
                    crashes = record.crashes()
            else:
                rows = list(map(ClaimedNotification._make, fetched))
            rows, run, failures = self._isolate_suspect(worker, cursor, rows, crashes)
            try:
                result = batch.run_batch(worker, run, delivery=_delivery, handle=self._handle)
            except batch.Redo:
                # Rolled back for a handler's failure: the claim with a savepoint per row
                # (Worker.process) must take these rows again, not the ones past them.
                self._start.again_from(rows[0].id)
                raise
            finally:
                self._decoded = {}
            failures.update((row.id, self._failure(row, exc)) for row, exc in result.failed)
            left = []
            if len(result.done) < len(rows):  # failures, or a stop: put the others back
                done = {row.id for row in result.done}
                left = [row for row in rows if row.id not in done]
            if left:
                cursor.execute(QUERIES["restore_notifications"], _restore_params(left, failures))
                self._start.from_start()  # back below where the next claim would start
        worker.handled += len(result.done)
        full = len(rows) >= worker.batch_size
        if full and self._refresh_statistics and time.monotonic() >= self._next_statistics_check:
            self._next_statistics_check = time.monotonic() + STATISTICS_CHECK_INTERVAL
            with connection.cursor() as cursor:
                params = {"channels": self.names, "limit": worker.batch_size, "from_id": 0}
                self._refresh_statistics = refresh_statistics(worker, cursor, params) is not False
        return len(rows)

    def _claim(self, connection, cursor, limit: int) -> list[tuple]:
        """Claim up to ``limit`` rows, sorted by id: past the last batch while batches come
        back full, else (or when that finds too few, or every FROM_START_INTERVAL) from the
        start of the index. The first claim opens the transaction (with its BEGIN, one round
        trip: wire.opening_rows)."""
        from_id = self._start.next()
        params = {"channels": self.names, "limit": limit, "from_id": from_id}
        # Prepared: the worker's connection is a session of its own (see opening_rows), and
        # the claim's plan does not look at from_id (a sub-select).
        (fetched,) = wire.opening_rows(
            connection,
            QUERIES["claim_notifications"],
            params,
            varying=("from_id",),
            prepare=True,
        )
        if len(fetched) < limit and from_id:
            # Rows the first read took are deleted in this transaction: not read again.
            params.update(limit=limit - len(fetched), from_id=0)
            cursor.execute(QUERIES["claim_notifications"], params)
            fetched += cursor.fetchall()
        fetched.sort()  # by id: the order of the claim's RETURNING is not defined
        self._start.claimed(fetched, limit)
        return fetched

    def _isolate_suspect(self, worker, cursor, rows, crashes):
        """What runs: the whole batch, or only its first suspect (a row whose batch died
        before), alone, or nothing when that suspect died alone too often (it becomes dead):
        claims.guard. ``crashes``: {row id: crashes} of the batch's suspects.

        Returns (rows with the suspect's crashes counted as attempts, rows to run, failures).
        """
        if not crashes:
            return rows, rows, {}
        claimed = [
            claims.Claimed(row.id, _delivery(row), self._specs[row.channel].max_attempts)
            for row in rows
        ]
        guarded = claims.guard(worker, "notification", claimed, crashes, worker.last_claim)
        suspect = guarded.suspect
        if suspect is None:
            return rows, rows[guarded.run], {}
        row = rows[suspect.index]
        counted = row._replace(attempts=row.attempts + suspect.crashes)
        rows = [counted if other.id == row.id else other for other in rows]
        claims.forget(cursor, "notification", row.id)
        if suspect.verdict is not None:
            return rows, [], {row.id: suspect.verdict}
        return rows, [counted], {}

    def _handle(self, row: ClaimedNotification) -> None:
        message = self._decoded.get(row.id)
        if message is None:
            message = self._decoders[row.channel](row.payload)
        elif isinstance(message, _Undecodable):
            raise message.error
        for func in self._listeners[row.channel]:
            func(message)

    def _decode_all(self, rows: list[ClaimedNotification]) -> dict[int, object]:
        """Each row's message by id, or _Undecodable (raised when the row runs: _handle)."""
        decoders, decoded = self._decoders, {}
        for row in rows:
            try:
                decoded[row.id] = decoders[row.channel](row.payload)
            except Exception as exc:
                decoded[row.id] = _Undecodable(exc)
        return decoded

    def _failure(self, row: ClaimedNotification, exc: Exception) -> batch.Failure:
        spec = self._specs[row.channel]
        return batch.failure(_delivery(row), exc, max_attempts=spec.max_attempts)

    def seconds_until_due(self, worker: Worker) -> float | None:
        return sources.query_value(worker, QUERIES["seconds_until_due"], {"channels": self.names})


def sorts_to_claim(cursor, params: dict) -> bool:
    """Whether the planner would sort the pending rows to claim a batch with ``params``: it
    does so when its statistics make them look rare (an ANALYZE of the table while it held no
    pending rows, or only other channels' rows), and then every batch sorts every pending row
    of the worker's channels (10 ms against 0.5 ms a batch with 50,000 waiting) instead of
    reading the pending index in id order, until autovacuum's next ANALYZE, or for good where
    autovacuum is off."""
    cursor.execute("EXPLAIN (FORMAT JSON) " + QUERIES["claim_notifications"], params)
    plans = [cursor.fetchone()[0][0]["Plan"]]
    while plans:
        plan = plans.pop()
        if plan["Node Type"] == "Sort":
            return True
        plans.extend(plan.get("Plans", ()))
    return False


def refresh_statistics(worker: Worker, cursor, params: dict) -> bool | None:
    """After a full batch: ANALYZE pgmsg_notification if the claim's plan sorts the pending
    rows (sorts_to_claim), through the worker's autocommit connection, one worker at a time.
    Returns whether the plan reads them in order now; None when there was nothing to do.
    False means the planner still sorts with fresh statistics (the worker's role may not
    analyze the table, or its channels' rows are rare in it): the caller stops asking."""
    conn = worker.side_connection()
    if conn is None or not sorts_to_claim(cursor, params):
        return None
    with conn.transaction():
        if not conn.execute(QUERIES["analyze_lock"], {"lock_class": locks.ANALYZE}).fetchone()[0]:
            return None  # another worker is at it
        conn.execute(QUERIES["analyze"])
    if sorts_to_claim(cursor, params):
        logger.info(
            "pgmsg: the claim of %s sorts its pending rows even after ANALYZE "
            "pgmsg_notification (rare channels, or a role that may not analyze the table)",
            params["channels"],
        )
        return False
    logger.info("pgmsg: analyzed pgmsg_notification: its statistics made the claim sort")
    return True


def warn_undeclared(db: str) -> dict[str, int]:
    """Log a warning for each channel with pending rows that no declaration names.

    Such rows are left alone, never dead-lettered: during a rolling deploy, producers may
    write a new channel before the workers that declare it are started. Returns
    {channel: pending rows}.
    """
    with connections[db].cursor() as cursor:
        cursor.execute(
            QUERIES["undeclared_channels"], {"declared": sorted(channels.registry.channels)}
        )
        found = dict(cursor.fetchall())
    for name, count in found.items():
        logger.warning(
            "pgmsg: %s pending notification(s) on channel %r, which no channel declaration of "
            "this project names: no worker handles them. Declare the channel (and a listener) "
            "in the code the workers run, or delete the rows.",
            count,
            name,
        )
    return found


class _Undecodable(NamedTuple):
    """A payload whose decoding raised ``error`` (raised again when its row runs)."""

    error: Exception


def _delivery(row: ClaimedNotification) -> batch.Delivery:
    return batch.Delivery("notification", row.id, row.channel, row.attempts)


def _decoder(spec: channels.ChannelSpec) -> Callable[[str], object]:
    if spec.is_trigger:
        return functools.partial(triggers.decode_row_change, spec.model)
    return payloads.jsonb_decoder(spec.payload_class)


def _decode(spec: channels.ChannelSpec, text: str):
    return payloads.jsonb_decoder(spec.payload_class)(text)


def _restore_params(
    rows: list[ClaimedNotification], failures: dict[int, batch.Failure]
) -> dict[str, list]:
    """Parameters of ``restore_notifications``: failures with their attempt counted, and rows
    left unhandled (a stopping worker, or later rows of a stopped group) as they were."""
    kept = [failures.get(row.id) for row in rows]
    return {
        "ids": [row.id for row in rows],
        "channels": [row.channel for row in rows],
        "payloads": [row.payload for row in rows],
        "attempts": [row.attempts for row in rows],
        "available_at": [row.available_at for row in rows],
        "created_at": [row.created_at for row in rows],
        "errors": [row.last_error if f is None else f.error for f, row in zip(kept, rows)],
        "failed_at": [row.last_failed_at for row in rows],
        "delays": [None if f is None else f.retry_in for f in kept],
        "dead": [f is not None and f.give_up for f in kept],
    }


class BroadcastSource:
    """Broadcast channels: payloads arrive on their own NOTIFY channels, nothing is stored."""

    label = "broadcast"

    def __init__(self, names: Iterable[str]) -> None:
        self.names = sorted(names)
        self.wake_payloads: list[str] = []  # nothing stored: NOTIFY is the message
        self.notify_channels = [channels.BROADCAST_PREFIX + name for name in self.names]

    def wants(self, wake_payload: str) -> bool:
        return False

    def process_batch(self, worker: Worker) -> int:
        return 0

    def seconds_until_due(self, worker: Worker) -> float | None:
        return None

    def on_notify(self, worker: Worker, notify_channel: str, text: str) -> None:
        name = notify_channel.removeprefix(channels.BROADCAST_PREFIX)
        spec = channels.registry.get(name)
        try:
            message = _decode(spec, text)
        except errors.PayloadError as exc:
            logger.error("pgmsg: broadcast on %r has a bad payload, dropped: %s", name, exc)
            return
        for func in channels.registry.listeners.get(name, []):
            try:
                with transaction.atomic(using=worker.database):
                    func(message)
            except worker_module.CONNECTION_ERRORS:
                raise  # the worker reconnects
            except Exception:
                logger.exception("pgmsg: broadcast listener %r on %r failed", func, name)
