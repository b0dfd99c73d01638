"""The outbox table's weekly partitions: made ahead, and a past week dropped once it holds
nothing pending or dead (docs/storage.md)."""

from __future__ import annotations

import datetime as dt
import logging
import time

from django.db import DatabaseError, connections, transaction
from psycopg import sql as pgsql

from pgmsg.core import conf, partitions, sql

logger = logging.getLogger(__name__)

QUERIES = sql.load(__package__, "weeks.sql")

TABLE = "pgmsg_outbox_message"
#: Weeks of partitions kept ready beyond the current one.
WEEKS_AHEAD = 2
#: Seconds between two passes by one worker (a pass is a catalog query and, for each past
#: week, two index probes).
CHECK_INTERVAL = 300.0


#: Keys trimmed per transaction (trim_keys).
KEYS_PER_TRIM = 10_000


def maintain(*, now: dt.datetime | None = None) -> list[str]:
    """The relays' periodic pass: partitions ahead, drop_emptied(), then trim_keys(). Returns
    the partitions dropped."""
    ensure_partitions(now=now)
    dropped = drop_emptied(now=now)
    trim_keys()
    return dropped


def trim_keys() -> int:
    """Delete the keys of pgmsg_outbox_key whose message is gone (relayed or discarded),
    KEYS_PER_TRIM a transaction, until fewer are found. A key outliving its row never refuses
    a message (the partitions are looked up then); trimming keeps the table to about the rows
    held. Returns the count."""
    database = conf.get().DATABASE
    trimmed = 0
    while True:
        with transaction.atomic(using=database), connections[database].cursor() as cursor:
            cursor.execute(QUERIES["lock_stale_keys"], {"limit": KEYS_PER_TRIM})
            stale = cursor.fetchall()
            if stale:
                cursor.execute(
                    QUERIES["delete_stale_keys"],
                    {"outboxes": [k[0] for k in stale], "message_ids": [k[1] for k in stale]},
                )
                trimmed += cursor.rowcount
        if len(stale) < KEYS_PER_TRIM:
            return trimmed


def ensure_partitions(*, now: dt.datetime | None = None) -> list[str]:
    """Create the outbox's weekly partitions from this week to WEEKS_AHEAD weeks on."""
    database = conf.get().DATABASE
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        return partitions.ensure_weeks(cursor, TABLE, ahead=WEEKS_AHEAD, now=now)


def drop_emptied(*, now: dt.datetime | None = None) -> list[str]:
    """Drop the partitions of past weeks that hold no row (every message in them was relayed
    or discarded): their relayed rows go with them, dead tuples and all. A week that still
    holds a pending or dead message stays, whatever its age; the default partition, this
    week's and those ahead stay too. A drop that waits more than 2 s for its lock is left to
    the next pass. Returns the names dropped."""
    database = conf.get().DATABASE
    this_week = partitions.week_start(now or dt.datetime.now(dt.UTC))
    with connections[database].cursor() as cursor:
        past = [
            p.name
            for p in partitions.partitions(cursor, TABLE)
            if not p.is_default and p.upper_time() <= this_week  # type: ignore[operator]
        ]
    dropped = []
    for name in past:
        try:
            with transaction.atomic(using=database), connections[database].cursor() as cursor:
                # Checked first without a lock (most passes find nothing to drop), then again
                # under it: a refused message parked by a logical relay keeps its created_at,
                # so a past week can receive a row until the lock is held.
                if _holds_rows(cursor, name):
                    continue
                cursor.execute(partitions.QUERIES["lock_timeout"])
                cursor.execute(QUERIES["lock_table"])
                if _holds_rows(cursor, name):
                    continue
                partitions.drop(cursor, name)
            dropped.append(name)
        except DatabaseError as exc:
            logger.info("pgmsg: outbox partition %s not dropped this pass: %s", name, exc)
    return dropped


def _holds_rows(cursor, name: str) -> bool:
    query = pgsql.SQL(QUERIES["holds_rows"]).format(partition=partitions.identifier(name))
    cursor.execute(query)
    return bool(cursor.fetchone()[0])


class Maintenance:
    """A worker's periodic pass, every CHECK_INTERVAL seconds from its first batch."""

    def __init__(self) -> None:
        self._next = 0.0

    def maybe_run(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + CHECK_INTERVAL
        try:
            maintain()
        except DatabaseError as exc:
            # A partition not made this pass (its lock was not granted in time) is made at
            # the next one; WEEKS_AHEAD leaves weeks of margin. The relay goes on.
            logger.warning("pgmsg: outbox partition maintenance failed, retried later: %s", exc)
