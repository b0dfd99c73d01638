"""Per-minute counts of handled and failed messages, kept in pgmsg_throughput for two hours.

The admin overview draws its last hour from them: stored notifications are deleted when they
are handled, so no other table remembers them.
"""

from __future__ import annotations

import os
import time
from collections import Counter

from django.db import connections

from pgmsg.core import sql

QUERIES = sql.load(__package__, "throughput.sql")
#: Seconds between a process's deletes of rows older than two hours.
PRUNE_INTERVAL = 300.0
#: Most seconds a running worker keeps committed counts before writing them (Tally).
FLUSH_INTERVAL = 1.0
_next_prune = 0.0


def record(database: str, handled: Counter, failed: Counter) -> None:
    """Add counts keyed by (kind, source) in the caller's transaction (the claim's)."""
    with connections[database].cursor() as cursor:
        _write(cursor, handled, failed)


class Tally:
    """A running worker's counts that committed but are not written yet.

    Batches add to it once their transaction commits; the worker writes it through its
    autocommit connection at most once every FLUSH_INTERVAL, even around its sleeps (it wakes
    for a write that comes due), and when it stops: one upsert a second instead of one per
    batch, which cost a round trip and a row update (a seventh of a 100-message batch's time,
    bench/drain.py), or one per message for a worker woken message by message. A worker
    killed with -9 loses the counts of its last second; the messages themselves are not
    affected.
    """

    def __init__(self) -> None:
        self.handled: Counter = Counter()
        self.failed: Counter = Counter()
        self._next_flush = 0.0

    def add(self, handled: Counter, failed: Counter) -> None:
        self.handled.update(handled)
        self.failed.update(failed)

    def seconds_until_flush(self) -> float | None:
        """When the counts held are due to be written (0: now); None when none are held."""
        if not (self.handled or self.failed):
            return None
        return max(self._next_flush - time.monotonic(), 0.0)

    def flush(self, connection, *, now: bool = False) -> None:
        """Write the counts (and prune), if FLUSH_INTERVAL has passed or ``now``. Kept if the
        write fails (the worker reconnects and writes them then)."""
        if not (self.handled or self.failed):
            return
        if not now and time.monotonic() < self._next_flush:
            return
        with connection.cursor() as cursor:
            _write(cursor, self.handled, self.failed)
        self.handled, self.failed = Counter(), Counter()
        self._next_flush = time.monotonic() + FLUSH_INTERVAL


def _write(cursor, handled: Counter, failed: Counter) -> None:
    global _next_prune
    keys = sorted(set(handled) | set(failed))
    if not keys:
        return
    cursor.execute(
        QUERIES["record"],
        {
            "pid": os.getpid(),
            "kinds": [kind for kind, _ in keys],
            "sources": [source for _, source in keys],
            "handled": [handled[key] for key in keys],
            "failed": [failed[key] for key in keys],
        },
    )
    now = time.monotonic()
    if now >= _next_prune:
        _next_prune = now + PRUNE_INTERVAL
        cursor.execute(QUERIES["prune"])
