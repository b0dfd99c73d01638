"""A bridge as the worker runs it: hold the bridge's lock, fetch a batch from the broker,
store it with one receive_many() in one transaction, and acknowledge the broker after the
commit.

A crash between the commit and the acknowledgement makes the broker deliver the batch again:
the inbox skips the ids it holds (a duplicate is stored once). A message that cannot be mapped
(no id, a body that is not JSON, too large) is stored in the same transaction as a dead letter
of the inbox, so it is acknowledged only once it is kept, and never holds back what follows.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time

from django.db import connections, transaction

from pgmsg.core import conf, errors, locks, sources, sql
from pgmsg.core.sources import Worker
from pgmsg.inbox import declarations as inbox
from pgmsg.inbox.bridges import brokers, declarations, mapping
from pgmsg.inbox.bridges.consumer import Consumer
from pgmsg.inbox.bridges.prefetch import Batches

logger = logging.getLogger("pgmsg.inbox")

QUERIES = sql.load(__package__, "bridges.sql")
_FIRST_BACKOFF = 0.5
#: Seconds between state reports while nothing changes (and between lag queries).
REPORT_EVERY = 2.0


class BridgeSource:
    """One bridge, run by the listen worker (see pgmsg/core/worker.py for the loop)."""

    def __init__(self, bridge: declarations.Bridge) -> None:
        self.bridge = bridge
        self.label = f"bridge:{bridge.name}"
        self.wake_payloads: list[str] = []  # the broker wakes nothing: the bridge polls it
        self._module = brokers.module(bridge)
        self._consumer: Consumer | None = None
        self._batches: Batches | None = None  # the consumer's, mapped (fetched ahead or not)
        self._held_on: object = None  # the DB connection the lock belongs to
        self._next_poll = 0.0
        self._next_take = 0.0
        self._backoff = 0.0
        self._error = ""
        self._last_message: dt.datetime | None = None
        self._reported: tuple | None = None
        self._next_report = 0.0

    # -- the Source protocol -------------------------------------------------------------------

    def wants(self, wake_payload: str) -> bool:
        return False

    def seconds_until_due(self, worker: Worker) -> float | None:
        if self._held_on is None:  # another process holds it: try again at the next take
            return max(self._next_take - time.monotonic(), 0.0)
        return max(min(self._next_poll, self._next_report) - time.monotonic(), 0.0)

    def process_batch(self, worker: Worker) -> int:
        if time.monotonic() < self._next_poll or not self._hold(worker):
            self._report(worker)
            return 0
        try:
            batches = self._connect()
            batch = batches.take(worker.batch_size)
        except errors.BrokerUnavailable as exc:
            self._broker_down(exc)
            self._report(worker)
            return 0
        except Exception as exc:
            self._broker_down(self._client_failed(exc))
            self._report(worker)
            return 0
        if not batch:
            self._next_poll = time.monotonic() + self.bridge.poll
            self._report(worker)
            return 0
        deliveries = [delivery for delivery, _ in batch]
        try:
            self._store(worker, [found for _, found in batch])
        except BaseException:
            # Not stored: the broker must deliver these again (closing hands them back).
            self._close()
            raise
        try:
            batches.ack(deliveries)
        except errors.BrokerUnavailable as exc:
            # Stored but not acknowledged: delivered again later, and skipped as duplicates.
            self._broker_down(exc)
        except Exception as exc:
            self._broker_down(self._client_failed(exc))
        self._last_message = dt.datetime.now(dt.UTC)
        worker.handled += len(deliveries)
        self._report(worker)
        return len(deliveries)

    # -- storing -------------------------------------------------------------------------------

    def _store(self, worker: Worker, mapped: list[dict | mapping.Rejected]) -> None:
        accepted: list[dict] = []
        rejected: list[mapping.Rejected] = []
        for found in mapped:
            if isinstance(found, mapping.Rejected):
                rejected.append(found)
            else:
                accepted.append(found)
        db = worker.database
        with transaction.atomic(using=db):
            if accepted:
                inbox.receive_many(self.bridge.inbox, accepted, using=db)
            if rejected:
                with connections[db].cursor() as cursor:
                    cursor.execute(
                        QUERIES["store_rejected"],
                        {
                            "inbox": self.bridge.inbox,
                            "source": self.label,
                            "message_ids": [r.message_id for r in rejected],
                            "types": [r.type for r in rejected],
                            "payloads": [r.payload for r in rejected],
                            "errors": [r.reason for r in rejected],
                        },
                    )
                for r in rejected:
                    logger.warning(
                        "pgmsg %s: dead letter %r: %s", self.label, r.message_id, r.reason
                    )

    # -- the broker ----------------------------------------------------------------------------

    def _connect(self) -> Batches:
        if self._batches is None:
            self._consumer = self._module.consumer(self.bridge)
            self._batches = Batches(self._consumer, self._convert, f"pgmsg-{self.label}")
        return self._batches

    def _convert(self, delivery: mapping.Delivery) -> dict | mapping.Rejected:
        return mapping.convert(self.bridge, delivery)

    def _client_failed(self, exc: Exception) -> errors.BrokerUnavailable:
        """A broker client that fails other than by a lost connection (a frame it cannot
        decode, an assertion of its own) fails this bridge, not the worker: the bridge drops
        the connection, reports the error, and connects again after a backoff, as when the
        broker is down. Nothing of the batch in hand was acknowledged."""
        logger.error("pgmsg %s: the broker client failed", self.label, exc_info=exc)
        return errors.BrokerUnavailable(
            f"bridge {self.bridge.name}: the broker client failed: {type(exc).__name__}: {exc}"
        )

    def _broker_down(self, exc: errors.BrokerUnavailable) -> None:
        self._close()
        self._backoff = min(
            max(self._backoff * 2, _FIRST_BACKOFF), conf.get().RECONNECT_BACKOFF_MAX
        )
        self._next_poll = time.monotonic() + self._backoff
        if str(exc) != self._error:
            logger.warning(
                "pgmsg %s: broker unavailable, nothing acknowledged, next try in %.1fs: %s",
                self.label,
                self._backoff,
                exc,
            )
        self._error = str(exc)

    def close(self) -> None:
        """The worker closes its connections: the lock goes with its session, and so does
        the broker connection (unacknowledged messages go back to the broker)."""
        self._close()
        self._held_on = None

    def _close(self) -> None:
        batches, self._batches, self._consumer = self._batches, None, None
        if batches is not None:
            try:
                batches.close()  # closes the consumer
            except Exception:  # closing is best effort: the connection is dropped either way
                pass

    # -- the lock ------------------------------------------------------------------------------

    def _hold(self, worker: Worker) -> bool:
        """Hold the bridge's session lock: one process consumes it at a time. Locks belong to
        the DB session: when the worker reconnected, the lock is gone (another process may
        have taken it), so the broker connection is dropped too and the lock taken again."""
        connection = connections[worker.database]
        connection.ensure_connection()
        if self._held_on is connection.connection:
            return True
        if self._held_on is not None:
            self._close()
            self._held_on = None
        if time.monotonic() < self._next_take:
            return False
        self._next_take = time.monotonic() + conf.get().SWEEP_INTERVAL
        with connection.cursor() as cursor:
            cursor.execute(
                QUERIES["take_bridge"], {"lock_space": locks.BRIDGE, "bridge": self.bridge.name}
            )
            taken = cursor.fetchone()[0]
        if taken:
            self._held_on = connection.connection
            logger.info("pgmsg %s: this process holds the bridge", self.label)
        return bool(taken)

    # -- health --------------------------------------------------------------------------------

    def _report(self, worker: Worker) -> None:
        """Write the bridge's state when it changed, and every REPORT_EVERY seconds while it
        runs (with the broker's lag, asked that often)."""
        if self._held_on is None:
            return  # another process runs it and reports
        connected = self._consumer is not None
        if connected:
            self._error = ""
            self._backoff = 0.0
        state = (connected, self._error, self._last_message is not None)
        now = time.monotonic()
        if state == self._reported and now < self._next_report:
            return
        lag = None
        if self._consumer is not None:
            try:
                lag = self._consumer.lag()
            except errors.BrokerUnavailable as exc:
                self._broker_down(exc)
                connected = False
            except Exception as exc:
                self._broker_down(self._client_failed(exc))
                connected = False
        self._reported, self._next_report = state, now + REPORT_EVERY
        with connections[worker.database].cursor() as cursor:
            cursor.execute(
                QUERIES["report"],
                {
                    "name": self.bridge.name,
                    "inbox": self.bridge.inbox,
                    "broker": self.bridge.describe(),
                    "connected": connected,
                    "error": self._error,
                    "last_message_at": self._last_message,
                    "lag": lag,
                    "pid": os.getpid(),
                },
            )


def worker_sources(options: sources.SourceOptions) -> list[BridgeSource]:
    """The listen worker's bridges: those named (``--bridge``), or every declared one."""
    named = options.named("bridges")
    if named is not None:
        found = [declarations.get(name) for name in sorted(set(named))]
    elif options.serve_all:
        found = [declarations.declared()[name] for name in sorted(conf.get().INBOX_BRIDGES)]
    else:
        found = []
    return [BridgeSource(bridge) for bridge in found]
