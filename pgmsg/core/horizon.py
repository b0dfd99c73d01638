"""The read horizon of gap-free readers, and the sessions that hold it back.

Event subscriptions (and ordered inboxes) read only rows whose ``transaction_id`` is below a
horizon: every transaction below it that could write this database has ended, so no row can
later appear before one already read. The horizon ignores transactions of other databases and
sessions that only read (see ``horizon.sql``); an open writing transaction in this database
still holds it back, and ``blockers()`` names it.
"""

from __future__ import annotations

import dataclasses

from django.db import connections

from pgmsg.core import conf, sql

QUERIES = sql.load(__package__, "horizon.sql")

#: A transaction holding the horizon back longer than this is reported by blockers().
BLOCKED_AFTER = 5.0


@dataclasses.dataclass(frozen=True)
class Blocker:
    """An open transaction of this database that holds the read horizon back."""

    pid: int | None  # None for a prepared transaction
    database: str
    state: str
    age: float  # seconds since its transaction began
    query: str

    def __str__(self) -> str:
        who = f"pid {self.pid}" if self.pid is not None else "a prepared transaction"
        # No query text: it may quote any table's data, and this line reaches the admin and
        # the health endpoint. Commands that show it add ``describe(with_query=True)``.
        return (
            f"{who} on database {self.database!r}, {self.state}, transaction open {self.age:.0f}s"
        )

    def describe(self, *, with_query: bool) -> str:
        return f"{self}: {self.query[:80]!r}" if with_query else str(self)


def horizon(cursor) -> int:
    """The transaction id below which every transaction that could write here has ended.

    Read rows below it in a later statement than this one (see horizon.sql).
    """
    cursor.execute(QUERIES["horizon"])
    return int(cursor.fetchone()[0])


def blockers(*, using: str | None = None, older_than: float | None = None) -> list[Blocker]:
    """The open transactions of this database holding the horizon back, oldest first."""
    with connections[using or conf.get().DATABASE].cursor() as cursor:
        cursor.execute(
            QUERIES["blockers"],
            {"older_than": BLOCKED_AFTER if older_than is None else older_than},
        )
        return [Blocker(*row) for row in cursor.fetchall()]
