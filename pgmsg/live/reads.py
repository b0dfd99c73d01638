"""The hub's reads of the event store, on its async connection (live.sql)."""

from __future__ import annotations

import psycopg

from pgmsg.core import horizon, sql, wake
from pgmsg.live.asks import Ask

QUERIES = sql.load(__package__, "live.sql")

#: Events read per statement, by the hub and by a client that catches up.
PAGE = 500

#: The checkpoint that sorts after every event of transactions below ``xid + 1``.
LAST_POSITION = 2**63 - 1


async def read_horizon(conn: psycopg.AsyncConnection) -> int:
    """The read horizon (core/horizon.py): every transaction below it has ended."""
    cursor = await conn.execute(horizon.QUERIES["horizon"])
    row = await cursor.fetchone()
    return int(row[0])


async def read_after(
    conn: psycopg.AsyncConnection, checkpoint: tuple[int, int], *, below: int, ask: Ask | None
) -> list[tuple]:
    """A page of events after ``checkpoint`` whose transactions are below ``below``, in read
    order; ``ask``'s filters, or none (the hub reads every category)."""
    cursor = await conn.execute(
        QUERIES["read_after"],
        {
            "xid": str(checkpoint[0]),
            "position": checkpoint[1],
            "xmin": str(below),
            "categories": sorted(ask.categories) if ask and ask.categories is not None else None,
            "stream": ask.stream if ask else None,
            "types": sorted(ask.types) if ask and ask.types else None,
            "limit": PAGE,
        },
    )
    return await cursor.fetchall()


async def above_horizon(conn: psycopg.AsyncConnection, below: int) -> bool:
    cursor = await conn.execute(QUERIES["above_horizon"], {"xmin": str(below)})
    return bool((await cursor.fetchone())[0])


async def checkpoint_of(conn: psycopg.AsyncConnection, position: int) -> tuple[int | None, int]:
    """The transaction id of the event at ``position`` (None if no such event is stored), and
    the store's last position (0 when it is empty)."""
    cursor = await conn.execute(QUERIES["checkpoint_of"], {"position": position})
    xid, last = await cursor.fetchone()
    return (int(xid) if xid is not None else None), (last or 0)


async def newest(conn: psycopg.AsyncConnection) -> tuple[int, int]:
    """The read-order key of the newest event below the read horizon ((0, 0): none yet)."""
    cursor = await conn.execute(QUERIES["newest"])
    row = await cursor.fetchone()
    return (int(row[0]), row[1]) if row else (0, 0)


async def stream_exists(conn: psycopg.AsyncConnection, stream: str) -> bool:
    cursor = await conn.execute(QUERIES["stream_exists"], {"stream": stream})
    return await cursor.fetchone() is not None


async def declare_idle(conn: psycopg.AsyncConnection, payloads: list[str], *, held: bool) -> bool:
    """Declare the hub idle for ``payloads`` unless the session ``held`` their idle locks
    already (core/wake.py: producers of them NOTIFY while it holds them), and try the
    barrier; True once it passed."""
    cursor = await conn.execute(
        wake.QUERIES["declare_idle"], {"missing": [] if held else payloads, "settle": payloads}
    )
    _declared, passed = await cursor.fetchone()
    return bool(passed)


async def withdraw(conn: psycopg.AsyncConnection, payloads: list[str]) -> None:
    """Busy: producers stop NOTIFYing for ``payloads``."""
    await conn.execute(wake.QUERIES["withdraw"], {"payloads": payloads})
