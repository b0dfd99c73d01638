"""Partitions of pgmsg's partitioned tables: list them, create them ahead, drop them.

pgmsg makes its own partitions (docs/storage.md): weekly ranges of a timestamp for tables
cleaned by age, ranges of a number for the event store. Identifiers are composed with
psycopg.sql from the catalog's own names or from names built here, never from input.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import re
from typing import Any

from psycopg import sql as pgsql

from pgmsg.core import sql

logger = logging.getLogger(__name__)

QUERIES = sql.load(__package__, "partitions.sql")

WEEK = dt.timedelta(days=7)
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclasses.dataclass(frozen=True)
class Partition:
    name: str
    #: Bounds as PostgreSQL prints them (None for the default partition); upper is exclusive.
    lower: str | None
    upper: str | None

    @property
    def is_default(self) -> bool:
        return self.lower is None

    def lower_time(self) -> dt.datetime | None:
        return None if self.lower is None else dt.datetime.fromisoformat(self.lower)

    def upper_time(self) -> dt.datetime | None:
        return None if self.upper is None else dt.datetime.fromisoformat(self.upper)


def identifier(name: str) -> pgsql.Identifier:
    """An identifier for one of pgmsg's own table names (checked: lowercase, 63 bytes)."""
    if not _NAME.match(name):
        raise ValueError(f"not a pgmsg table name: {name!r}")
    return pgsql.Identifier(name)


def partitions(cursor, table: str) -> list[Partition]:
    """The partitions of ``table``, the default one first, then by lower bound."""
    cursor.execute(QUERIES["list_partitions"], {"table": table})
    return [Partition(*row) for row in cursor.fetchall()]


def week_start(moment: dt.datetime) -> dt.datetime:
    """Monday 00:00 UTC of the week of ``moment``."""
    day = moment.astimezone(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day - dt.timedelta(days=day.weekday())


def week_name(table: str, start: dt.datetime) -> str:
    return f"{table}_p{start:%Y%m%d}"


def month_start(moment: dt.datetime, months: int = 0) -> dt.datetime:
    """The first instant (UTC) of the month ``months`` after that of ``moment``."""
    moment = moment.astimezone(dt.UTC)
    index = moment.year * 12 + moment.month - 1 + months
    return dt.datetime(index // 12, index % 12 + 1, 1, tzinfo=dt.UTC)


def month_name(table: str, start: dt.datetime) -> str:
    return f"{table}_p{start:%Y%m}"


def create(cursor, table: str, name: str, lower: Any, upper: Any) -> None:
    """Create partition ``name`` of ``table`` for [lower, upper)."""
    statement = pgsql.SQL(QUERIES["create_partition"]).format(
        table=identifier(table),
        partition=identifier(name),
        lower=pgsql.Literal(lower),
        upper=pgsql.Literal(upper),
    )
    cursor.execute(QUERIES["lock_timeout"])
    cursor.execute(statement)
    logger.info("pgmsg: created partition %s of %s for [%s, %s)", name, table, lower, upper)


def ensure_weeks(cursor, table: str, *, ahead: int, now: dt.datetime | None = None) -> list[str]:
    """Create the weekly partitions of ``table`` missing from this week to ``ahead`` weeks on
    (run inside a transaction). A week that an existing partition overlaps is left alone.
    Returns the names created."""
    first = week_start(now or dt.datetime.now(dt.UTC))
    ranges = [(first + n * WEEK, first + (n + 1) * WEEK) for n in range(ahead + 1)]
    return _ensure(cursor, table, [(week_name(table, lo), lo, hi) for lo, hi in ranges])


def ensure_months(cursor, table: str, *, ahead: int, now: dt.datetime | None = None) -> list[str]:
    """ensure_weeks() by calendar month (UTC)."""
    now = now or dt.datetime.now(dt.UTC)
    ranges = [(month_start(now, n), month_start(now, n + 1)) for n in range(ahead + 1)]
    return _ensure(cursor, table, [(month_name(table, lo), lo, hi) for lo, hi in ranges])


def _ensure(cursor, table: str, wanted: list[tuple[str, dt.datetime, dt.datetime]]) -> list[str]:
    existing = [p for p in partitions(cursor, table) if not p.is_default]
    spans = [(p.lower_time(), p.upper_time()) for p in existing]
    created = []
    for name, lower, upper in wanted:
        if any(lo < upper and lower < hi for lo, hi in spans):  # type: ignore[operator]
            continue
        create(cursor, table, name, lower, upper)
        created.append(name)
    return created


def drop(cursor, name: str) -> None:
    """Drop one partition with its rows."""
    cursor.execute(QUERIES["lock_timeout"])
    cursor.execute(pgsql.SQL(QUERIES["drop_partition"]).format(partition=identifier(name)))
    logger.info("pgmsg: dropped partition %s", name)
