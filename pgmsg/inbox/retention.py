"""Inbox retention and partitions: weekly partitions made ahead, expired rows removed by
dropping or emptying whole partitions instead of deleting rows (docs/storage.md)."""

from __future__ import annotations

import datetime as dt
import logging

import pgtrigger
from django.db import connections, transaction
from psycopg import sql as pgsql

from pgmsg.core import conf, partitions, sql
from pgmsg.inbox import declarations as inbox

logger = logging.getLogger(__name__)

QUERIES = sql.load(__package__, "retention.sql")

TABLE = "pgmsg_inbox_message"
#: Weeks of partitions kept ready beyond the current one.
WEEKS_AHEAD = 2
#: A partition is rewritten only when it keeps at most this many rows: the copy is made while
#: the partition is locked, so its size bounds how long receipts into it wait.
MOST_KEPT = 10_000
#: Skips the first-receipt check for rows put back into the partition they came from.
_FIRST_RECEIPT = "pgmsg.InboxMessage:pgmsg_inbox_first_receipt"


#: Keys trimmed per transaction (trim_keys).
KEYS_PER_TRIM = 10_000


def maintain() -> dict[str, int]:
    """The workers' periodic pass (every PGMSG INBOX_RETENTION_INTERVAL): partitions ahead,
    then drop_expired(), then trim_keys() when rows were removed."""
    ensure_partitions()
    removed = drop_expired()
    if removed["processed"] or removed["dead"]:
        trim_keys()
    return removed


def trim_keys() -> int:
    """Delete the keys of pgmsg_inbox_key whose message is gone (KEYS_PER_TRIM a transaction,
    until fewer are found). A key outliving its row never refuses a message (the partitions
    are looked up then); trimming keeps the table to about the rows held. Returns the count."""
    database = conf.get().DATABASE
    trimmed = 0
    while True:
        with transaction.atomic(using=database), connections[database].cursor() as cursor:
            cursor.execute(QUERIES["lock_stale_keys"], {"limit": KEYS_PER_TRIM})
            stale = cursor.fetchall()
            if stale:
                cursor.execute(
                    QUERIES["delete_stale_keys"],
                    {"inboxes": [k[0] for k in stale], "message_ids": [k[1] for k in stale]},
                )
                trimmed += cursor.rowcount
        if len(stale) < KEYS_PER_TRIM:
            return trimmed


def ensure_partitions(*, now: dt.datetime | None = None) -> list[str]:
    """Create the inbox's weekly partitions from this week to WEEKS_AHEAD weeks on."""
    database = conf.get().DATABASE
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        return partitions.ensure_weeks(cursor, TABLE, ahead=WEEKS_AHEAD, now=now)


def drop_expired() -> dict[str, int]:
    """Remove the rows retention allows (processed older than PGMSG INBOX_RETENTION, dead or
    discarded older than INBOX_DEAD_RETENTION, a dead head holding an ordered aggregate back
    kept) a whole partition at a time: a partition where nothing is kept is dropped (emptied,
    if it is this week's or later, or the default one); one that keeps at most MOST_KEPT rows
    is emptied and gets those rows back. Returns the counts removed, as {"processed": n,
    "dead": m}; partitions that keep more wait for a later pass.
    """
    settings = conf.get()
    params = {
        "processed_seconds": settings.INBOX_RETENTION,
        "dead_seconds": settings.INBOX_DEAD_RETENTION,
        "ordered": sorted(n for n, spec in inbox.registry.inboxes.items() if spec.ordered),
        "limit": MOST_KEPT,
    }
    removed = {"processed": 0, "dead": 0}
    now = dt.datetime.now(dt.UTC)
    this_week = partitions.week_start(now)
    # Every row of a partition that ended before this is old enough to have expired: such a
    # partition is counted once, under its lock. Newer ones (and the default one) are counted
    # first without a lock, so that one with nothing to remove is never locked.
    old = now - dt.timedelta(seconds=min(settings.INBOX_RETENTION, settings.INBOX_DEAD_RETENTION))
    with connections[settings.DATABASE].cursor() as cursor:
        found = partitions.partitions(cursor, TABLE)
    for partition in found:
        upper = partition.upper_time()
        if upper is None or upper > old:
            with connections[settings.DATABASE].cursor() as cursor:
                processed, dead, kept = _expired_counts(cursor, partition.name, params)
            if not (processed or dead) or kept > MOST_KEPT:
                continue
        past = upper is not None and upper <= this_week
        gone = _rewrite(partition.name, params, drop_when_empty=past)
        removed["processed"] += gone[0]
        removed["dead"] += gone[1]
    if removed["processed"] or removed["dead"]:
        logger.info("pgmsg: inbox retention removed %s by partition", removed)
    return removed


def _rewrite(name: str, params: dict, *, drop_when_empty: bool) -> tuple[int, int]:
    """Lock partition ``name``, count what goes, set the rows to keep aside, drop or empty it,
    put them back. Returns (processed, other) rows removed; (0, 0) when nothing may go or it
    keeps more than MOST_KEPT rows."""
    database = conf.get().DATABASE
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        cursor.execute(partitions.QUERIES["lock_timeout"])
        cursor.execute(_compose("lock_partition", name))
        processed, dead, kept = _expired_counts(cursor, name, params)
        if not (processed or dead) or kept > MOST_KEPT:
            return 0, 0
        if kept:
            cursor.execute(_compose("keep_rows", name), params)
        if not kept and drop_when_empty:
            partitions.drop(cursor, name)
        else:
            cursor.execute(_compose("empty_partition", name))
            if kept:
                with pgtrigger.ignore(_FIRST_RECEIPT):
                    cursor.execute(_compose("restore_kept", name))
    return processed, dead


def _expired_counts(cursor, name: str, params: dict) -> tuple[int, int, int]:
    """(processed, dead or discarded) rows of partition ``name`` that may go, and the rows it
    must keep. Every row that is not counted as kept is processed and expired, so the rows that
    may go are the partition's count less the few found by index probes (retention.sql)."""
    cursor.execute(_compose("expired_counts", name), params)
    total, pending, young, failed_gone, failed_kept = cursor.fetchone()
    kept = pending + young + failed_kept
    return total - kept - failed_gone, failed_gone, kept


def _compose(statement: str, partition: str) -> pgsql.Composed:
    return pgsql.SQL(QUERIES[statement]).format(partition=partitions.identifier(partition))
