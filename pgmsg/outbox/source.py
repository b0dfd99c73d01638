"""The table-mode relay: a worker source that publishes an outbox's rows to its destination.

Per batch, in one transaction: claim due pending rows of the partitions this relay holds
(FOR UPDATE SKIP LOCKED, a key whose head failed left out), publish them in *waves*, delete
what the broker confirmed and record what it refused, commit. A wave holds at most one message
per key (and every keyless one): its messages are published together and their confirmations
awaited together, and a key's next message goes in the next wave only once the previous one
was confirmed. So a refusal holds back its own key only, and a key never has two messages in
flight, whatever the broker does with a failed one.

A broker that cannot be reached (or does not confirm in time) is not the messages' fault: the
rows stay pending with no attempt counted, and the relay tries again after a backoff that
doubles up to PGMSG RECONNECT_BACKOFF_MAX.

The batch runner of the other sources (core.batch.run_batch) runs handlers one by one under
savepoints; here the "handler" is a broker round trip whose confirmations are awaited a wave
at a time, so the relay keeps its own loop and shares the failure rule (core.batch.failure).
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from typing import Any

from django.db import connections, transaction

from pgmsg.core import batch, conf, errors, locks, sources, sql
from pgmsg.core.sources import Worker
from pgmsg.outbox import declarations, destinations, partitions
from pgmsg.outbox.destinations.base import Envelope, Outcome

logger = logging.getLogger("pgmsg.outbox")

QUERIES = sql.load(__package__, "outbox.sql")

#: NOTIFY payload on the wake channel for an outbox: "outbox:<name>" (see models/outbox.py).
WAKE_PREFIX = "outbox:"
_FIRST_BACKOFF = 0.5


class OutboxRelay:
    """One outbox, published by the listen worker (see pgmsg/core/worker.py for the loop)."""

    def __init__(self, spec: declarations.Outbox, partition: tuple[int, int] | None = None):
        self.outbox = spec
        self.label = self._wake = WAKE_PREFIX + spec.name
        self.wake_payloads = [self._wake]  # see pgmsg/core/wake.py
        share, shares = partition or (0, 1)
        #: The partitions this relay may take: all, or those of its share (--partition i/N).
        self.candidates = [p for p in range(spec.partitions) if p % shares == share]
        if shares > 1:
            self.label += f" (share {share}/{shares})"
        self.held: list[int] = []
        self._held_on: object = None  # the DB connection the locks belong to
        self._next_take = 0.0
        #: destination name -> (monotonic time of the next try, current backoff)
        self._down: dict[str, tuple[float, float]] = {}
        #: Destinations whose refusals were logged since their last delivery: one line per
        #: streak (a missing exchange refuses every try), the streak's other refusals at DEBUG.
        self._refusing: set[str] = set()
        self._maintenance = partitions.Maintenance()

    # -- the Source protocol -------------------------------------------------------------------

    def wants(self, wake_payload: str) -> bool:
        return wake_payload == self._wake

    def seconds_until_due(self, worker: Worker) -> float | None:
        waits = [until - time.monotonic() for until, _ in self._down.values()]
        if len(self.held) < len(self.candidates):
            waits.append(self._next_take - time.monotonic())
        due = sources.query_value(
            worker, QUERIES["seconds_until_due"], {"outbox": self.outbox.name}
        )
        if due is not None:
            waits.append(due)
        return min(waits) if waits else None

    def process_batch(self, worker: Worker) -> int:
        self.maintain(worker)
        self._take_partitions(worker)
        if not self.held or self._waiting_for(self.outbox.destination):
            return 0
        db = worker.database
        with transaction.atomic(using=db), connections[db].cursor() as cursor:
            cursor.execute(
                QUERIES["claim"],
                {
                    "outbox": self.outbox.name,
                    "parts": self.outbox.partitions,
                    "partitions": self.held,
                    "limit": worker.batch_size,
                },
            )
            envelopes = [self._envelope(row) for row in cursor.fetchall()]
            if not envelopes:
                return 0
            sent, refused = self._publish(worker, envelopes)
            if sent:
                cursor.execute(QUERIES["ack"], {"ids": [e.id for e in sent]})
            if refused:
                cursor.execute(QUERIES["fail"], self._failure_params(refused))
        worker.handled += len(sent)
        # A full batch may have more behind it; one that published nothing must not spin.
        return len(envelopes) if sent or refused else 0

    # -- publishing ----------------------------------------------------------------------------

    def _publish(self, worker: Worker, envelopes: list[Envelope]):
        sent: list[Envelope] = []
        refused: list[tuple[Envelope, errors.MessageRefused]] = []
        blocked: set[str] = set()  # keys with a message not confirmed in this batch
        for wave in _waves(envelopes):
            if worker.stopping:
                break
            by_destination: dict[str, list[Envelope]] = defaultdict(list)
            for envelope in wave:
                if envelope.key is not None and envelope.key in blocked:
                    continue
                if self._waiting_for(envelope.destination):
                    _block(blocked, envelope)
                    continue
                by_destination[envelope.destination].append(envelope)
            for name, group in by_destination.items():
                for envelope, outcome in zip(group, self._send(name, group)):
                    if outcome is None:
                        sent.append(envelope)
                    else:
                        _block(blocked, envelope)
                        if isinstance(outcome, errors.MessageRefused):
                            refused.append((envelope, outcome))
        return sent, refused

    def _send(self, name: str, group: list[Envelope]) -> list[Outcome]:
        try:
            outcomes = destinations.get(name).publish(group)
        except errors.UnknownDestination as exc:
            # A destination removed from the settings: a refusal, so it ends as a dead letter
            # that names the problem instead of blocking the outbox for ever.
            return [errors.MessageRefused(str(exc))] * len(group)
        except errors.BrokerUnavailable as exc:
            outcomes = [exc] * len(group)
        unavailable = next((o for o in outcomes if isinstance(o, errors.BrokerUnavailable)), None)
        if unavailable is not None:
            self._broker_down(name, unavailable)
        elif name in self._down:
            logger.warning("pgmsg outbox %r: destination %r is back", self.outbox.name, name)
            del self._down[name]
        if name in self._refusing and any(o is None for o in outcomes):
            self._refusing.discard(name)
            logger.warning("pgmsg outbox %r: destination %r delivers again", self.outbox.name, name)
        return outcomes

    def _broker_down(self, name: str, exc: errors.BrokerUnavailable) -> None:
        _, backoff = self._down.get(name, (0.0, 0.0))
        backoff = min(max(backoff * 2, _FIRST_BACKOFF), conf.get().RECONNECT_BACKOFF_MAX)
        self._down[name] = (time.monotonic() + backoff, backoff)
        logger.warning(
            "pgmsg outbox %r: destination %r unavailable, messages kept, next try in %.1fs: %s",
            self.outbox.name,
            name,
            backoff,
            exc,
        )

    def _waiting_for(self, name: str) -> bool:
        down = self._down.get(name)
        return down is not None and time.monotonic() < down[0]

    def _envelope(self, row: tuple) -> Envelope:
        id_, message_id, destination, topic, type_, key, payload, headers, attempts, created = row
        return Envelope(
            id=id_,
            outbox=self.outbox.name,
            message_id=message_id,
            destination=destination,
            topic=topic,
            type=type_,
            key=key,
            payload=payload,
            headers=json.loads(headers),
            attempts=attempts,
            created_at=created,
        )

    def _failure_params(self, refused) -> dict[str, Any]:
        failures = []
        for e, exc in refused:
            quiet = e.destination in self._refusing
            self._refusing.add(e.destination)
            failures.append(
                batch.failure(
                    batch.Delivery("outbox message", e.id, e.outbox, e.attempts),
                    exc,
                    max_attempts=self.outbox.max_attempts,
                    where=f" to {e.destination!r}",
                    quiet=quiet,
                )
            )
        return {
            "ids": [e.id for e, _ in refused],
            "errors": [f.error for f in failures],
            "delays": [f.retry_in for f in failures],
            "dead": [f.give_up for f in failures],
        }

    # -- partitions ----------------------------------------------------------------------------

    def maintain(self, worker: Worker) -> None:
        """The outbox table's weekly partitions are shared by every outbox: the worker's first
        relay makes them ahead and drops the emptied ones (outbox/partitions.py)."""
        if self is next(s for s in worker.sources if isinstance(s, OutboxRelay)):
            self._maintenance.maybe_run()

    def _take_partitions(self, worker: Worker) -> None:
        """Hold the candidate partitions nobody holds (session advisory locks).

        Locks belong to the DB session: when the worker reconnected, they are gone and are
        taken again; another relay's locks are tried again every SWEEP_INTERVAL (takeover).
        """
        connection = connections[worker.database]
        connection.ensure_connection()
        if self._held_on is not connection.connection:
            self.held, self._held_on, self._next_take = [], connection.connection, 0.0
        missing = [p for p in self.candidates if p not in self.held]
        if not missing or time.monotonic() < self._next_take:
            return
        self._next_take = time.monotonic() + conf.get().SWEEP_INTERVAL
        with connection.cursor() as cursor:
            cursor.execute(
                QUERIES["take_partitions"],
                {"outbox": self.outbox.name, "lock_space": locks.OUTBOX, "partitions": missing},
            )
            taken = [row[0] for row in cursor.fetchall()]
        if taken:
            self.held = sorted(self.held + taken)
            logger.info(
                "pgmsg outbox %r: relay holds partition(s) %s of %s",
                self.outbox.name,
                self.held,
                self.outbox.partitions,
            )


def _waves(envelopes: list[Envelope]) -> list[list[Envelope]]:
    """Wave i: the i-th message of each key, and (in wave 0) every keyless message."""
    waves: list[list[Envelope]] = []
    depth: dict[str, int] = defaultdict(int)
    for envelope in envelopes:
        index = 0
        if envelope.key is not None:
            index = depth[envelope.key]
            depth[envelope.key] += 1
        if index == len(waves):
            waves.append([])
        waves[index].append(envelope)
    return waves


def _block(blocked: set[str], envelope: Envelope) -> None:
    if envelope.key is not None:
        blocked.add(envelope.key)
