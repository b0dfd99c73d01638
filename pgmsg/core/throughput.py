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
_next_prune = 0.0


def record(database: str, handled: Counter, failed: Counter) -> None:
    """Add counts keyed by (kind, source) in the caller's transaction (the claim's)."""
    global _next_prune
    keys = sorted(set(handled) | set(failed))
    if not keys:
        return
    with connections[database].cursor() as cursor:
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
