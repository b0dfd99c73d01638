"""The event store's monthly partitions: made ahead, sealed once past, and the read floors
that let a subscription's read skip sealed months (docs/storage.md)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time

from django.db import DatabaseError, connections, transaction
from psycopg import sql as pgsql

from pgmsg.core import conf, partitions, sql

logger = logging.getLogger(__name__)

QUERIES = sql.load(__package__, "partitions.sql")

TABLE = "pgmsg_event"
#: Months of partitions kept ready beyond the current one.
MONTHS_AHEAD = 2
#: Seconds between two checks by one worker (a check is one catalog query).
CHECK_INTERVAL = 300.0
SEAL_PREFIX = "pgmsg_sealed_below_"


def ensure_partitions(*, now: dt.datetime | None = None) -> list[str]:
    """Create the event store's monthly partitions from this month to MONTHS_AHEAD on."""
    database = conf.get().DATABASE
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        return partitions.ensure_months(cursor, TABLE, ahead=MONTHS_AHEAD, now=now)


# -- seals -----------------------------------------------------------------------------------
#
# A subscription reads in (transaction_id, position) order, and the table is partitioned by
# recorded_at (the appending transaction's start), whose order is not that of transaction ids:
# a transaction that began before a month's end may append into that month long after later
# transactions appended into the next. So no recorded_at bound follows from a checkpoint by
# itself. A *seal* supplies one: once no open transaction of this database began before a
# month's end, no append can route into that month again (each append's recorded_at is its
# transaction's start); the month is then locked against writers, its highest transaction id
# read, and a CHECK constraint added that refuses any row at or above it. From then on
# PostgreSQL itself guarantees the bound, whatever writes later (an INSERT with an explicit old
# recorded_at fails instead of slipping in below a checkpoint).


@dataclasses.dataclass(frozen=True)
class Range:
    """One range partition of the event store, with its seal's bound (None: not sealed)."""

    oid: int
    name: str
    lower: dt.datetime
    upper: dt.datetime
    seal: str | None

    @property
    def below(self) -> int | None:
        """Every row of a sealed partition has a transaction id below this."""
        return int(self.seal.removeprefix(SEAL_PREFIX)) if self.seal else None


def ranges(cursor) -> list[Range]:
    """The event store's range partitions, oldest first, with their seals."""
    cursor.execute(QUERIES["ranges"])
    found = [
        Range(oid, name, dt.datetime.fromisoformat(lo), dt.datetime.fromisoformat(hi), seal)
        for oid, name, lo, hi, seal in cursor.fetchall()
    ]
    return sorted(found, key=lambda r: r.lower)


def seal_partitions(*, now: dt.datetime | None = None) -> list[str]:
    """Seal every month that has ended and that no open transaction of this database began
    before the end of (each in its own transaction; a month whose writers do not finish
    within the lock timeout is left for the next pass). Returns the names sealed."""
    database = conf.get().DATABASE
    now = now or dt.datetime.now(dt.UTC)
    with connections[database].cursor() as cursor:
        cursor.execute(QUERIES["oldest_transaction"])
        oldest, visible = cursor.fetchone()
        if not visible:
            return []  # a transaction this role cannot see might still append into a month
        pending = [r for r in ranges(cursor) if r.seal is None and r.upper <= now]
    sealed = []
    for month in pending:
        if oldest is not None and oldest < month.upper:
            continue  # that transaction may still append into this month
        try:
            with transaction.atomic(using=database), connections[database].cursor() as cursor:
                _seal(cursor, month)
        except DatabaseError as exc:  # a writer held the month past the lock timeout
            logger.info("pgmsg: %s not sealed this time: %s", month.name, exc)
            continue
        sealed.append(month.name)
    return sealed


def _seal(cursor, month: Range) -> None:
    table = partitions.identifier(month.name)
    cursor.execute(QUERIES["lock_timeout"])
    cursor.execute(pgsql.SQL(QUERIES["lock_for_seal"]).format(partition=table))
    cursor.execute(pgsql.SQL(QUERIES["seal_bound"]).format(partition=table))
    bound = int(cursor.fetchone()[0])
    cursor.execute(
        pgsql.SQL(QUERIES["seal"]).format(
            partition=table,
            name=pgsql.Identifier(f"{SEAL_PREFIX}{bound}"),
            bound=pgsql.Literal(str(bound)),
        )
    )
    logger.info("pgmsg: sealed %s below transaction %s", month.name, bound)


# -- read floors -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Floor:
    """A recorded_at bound below which no event after a checkpoint at or above ``xid`` lies:
    the sealed months before it hold only lower transaction ids. The read checks, in its own
    statement, that those seals still stand (``oids``, ``seals``) and that no row lies below
    the oldest of them (``lowest``: such a row would be in the default partition)."""

    at: dt.datetime
    xid: int
    oids: list[int]
    seals: list[str]
    lowest: dt.datetime


def floor(months: list[Range], xid: int) -> Floor | None:
    """The floor for reads after a checkpoint whose transaction id is ``xid``: the end of the
    longest run of contiguous oldest months sealed at or below ``xid``; None when there is
    none (read every month)."""
    skipped: list[Range] = []
    for month in months:
        below = month.below
        if below is None or below > xid:
            break
        if skipped and skipped[-1].upper != month.lower:
            break  # a gap: rows there would be in the default partition, below the floor
        skipped.append(month)
    if not skipped:
        return None
    return Floor(
        at=skipped[-1].upper,
        xid=xid,
        oids=[m.oid for m in skipped],
        seals=[m.seal or "" for m in skipped],
        lowest=skipped[0].lower,
    )


class Maintenance:
    """A worker's periodic check, every CHECK_INTERVAL seconds from its first batch: months
    made ahead, and past months sealed."""

    def __init__(self) -> None:
        self._next = 0.0

    def maybe_run(self) -> bool:
        """Run when due; True when it ran."""
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + CHECK_INTERVAL
        ensure_partitions()
        seal_partitions()
        analyze_new_months()
        return True


def analyze_new_months() -> list[str]:
    """ANALYZE the months that hold events but were never analyzed (autovacuum off, or not
    yet come round): without statistics the planner guesses a partition's bucket holds a
    handful of events and sorts where it should read the index in order (subscriptions.py,
    ensure_partition_reads). Returns the names analyzed."""
    database = conf.get().DATABASE
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        cursor.execute(QUERIES["never_analyzed"])
        names = [row[0] for row in cursor.fetchall()]
        for name in names:
            cursor.execute(pgsql.SQL("ANALYZE {}").format(pgsql.Identifier(name)))
    if names:
        logger.info("pgmsg: analyzed event partitions %s", names)
    return names
