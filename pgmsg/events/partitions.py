"""The event store's monthly partitions, made ahead (docs/storage.md)."""

from __future__ import annotations

import datetime as dt
import time

from django.db import connections, transaction

from pgmsg.core import conf, partitions

TABLE = "pgmsg_event"
#: Months of partitions kept ready beyond the current one.
MONTHS_AHEAD = 2
#: Seconds between two checks by one worker (a check is one catalog query).
CHECK_INTERVAL = 300.0


def ensure_partitions(*, now: dt.datetime | None = None) -> list[str]:
    """Create the event store's monthly partitions from this month to MONTHS_AHEAD on."""
    database = conf.get().DATABASE
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        return partitions.ensure_months(cursor, TABLE, ahead=MONTHS_AHEAD, now=now)


class Maintenance:
    """A worker's periodic check, every CHECK_INTERVAL seconds from its first batch."""

    def __init__(self) -> None:
        self._next = 0.0

    def maybe_run(self) -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + CHECK_INTERVAL
            ensure_partitions()
