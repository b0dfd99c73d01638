"""Reading the event store: a stream's events, and every event in the gap-free read order."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connections

from pgmsg.core import asynchrony, conf, errors, horizon
from pgmsg.events.names import validate_category, validate_stream_name
from pgmsg.events.store import (
    QUERIES,
    Checkpoint,
    Event,
    RecordedEvent,
    as_checkpoint,
)


def stream_version(stream: str) -> int:
    """The stream's current version (0 if it has no events)."""
    with connections[conf.get().DATABASE].cursor() as cursor:
        cursor.execute(QUERIES["stream_version"], {"stream": validate_stream_name(stream)})
        row = cursor.fetchone()
    return row[0] if row else 0


def read_stream(
    stream: str, *, start: int | None = None, backwards: bool = False, limit: int | None = None
) -> list[RecordedEvent]:
    """Events of one stream in version order (or reversed), from version ``start`` on (default:
    the first, or the last when backwards), at most ``limit``.

    Raises ArchivedEvents, naming the archive, when events it should return were archived
    to Parquet and dropped (manage.py pgmsg_archive): versions never have gaps otherwise.
    """
    validate_stream_name(stream)
    if start is None:
        start = 2**31 - 1 if backwards else 1
    with connections[conf.get().DATABASE].cursor() as cursor:
        cursor.execute(
            QUERIES["read_stream_backwards" if backwards else "read_stream_forwards"],
            {"stream": stream, "version": start, "limit": limit},
        )
        events = RecordedEvent.from_rows(cursor.fetchall())
        if backwards:
            short = (limit is None or len(events) < limit) and start >= 1
            missing = short and (not events or events[-1].version > 1)
            wanted = 1
        else:
            missing = not events or events[0].version > start
            wanted = start
        if missing:
            _raise_if_archived(cursor, stream, wanted, events)
    return events


def _raise_if_archived(cursor, stream: str, wanted: int, events: list[RecordedEvent]) -> None:
    """Versions from ``wanted`` are missing before ``events``: archived, or never appended."""
    first = min((e.position for e in events), default=None)
    cursor.execute(QUERIES["archived_paths"], {"stream": stream, "position": first})
    row = cursor.fetchone()
    if row is None or row[0] < wanted or not row[1]:
        return  # a stream that does not reach that version
    before = min((e.version for e in events), default=row[0] + 1)
    raise errors.ArchivedEvents(
        f"stream {stream!r}: versions {wanted}..{before - 1} were archived to Parquet and are "
        f"no longer in PostgreSQL; read them from {', '.join(row[1])} (or load the aggregate "
        "from a snapshot taken after them)"
    )


def read_all(
    after: Checkpoint | tuple[int, int] | None = None,
    *,
    category: str | None = None,
    types: Iterable[str | type[Event]] | None = None,
    limit: int = 1000,
) -> list[RecordedEvent]:
    """Events after checkpoint ``after`` in the store's gap-free read order.

    Only events of ended transactions are returned, in (transaction_id, position) order: an
    event committed later never sorts before one returned now, so a reader that continues from
    the last returned ``.checkpoint`` misses nothing. Positions are unique and rise within a
    stream, but the read order across streams is by transaction, not by position.

    ``after``: omitted or None (or ``START``) reads from the beginning; otherwise a
    ``Checkpoint`` (an event's ``.checkpoint``), or the pair of ints it is, as stored.
    """
    after = as_checkpoint(after)
    with connections[conf.get().DATABASE].cursor() as cursor:
        xmin = read_horizon(cursor)
        return read_ordered(
            cursor, after=after, xmin=xmin, category=category, types=types, limit=limit
        )


aread_stream = asynchrony.awaitable(read_stream)
aread_all = asynchrony.awaitable(read_all)


def read_horizon(cursor) -> int:
    """The transaction id below which every transaction that could append here has ended:
    reads stop there. Open transactions of other databases, and sessions that only read, do
    not hold it back (see pgmsg/core/horizon.sql). Read below it in a later statement."""
    return horizon.horizon(cursor)


def horizon_blockers(
    *, using: str | None = None, older_than: float | None = None
) -> list[horizon.Blocker]:
    """The open transactions of this database that hold the read horizon back (pid, database,
    state, age, query), oldest first: what to look at when subscriptions or incremental
    exports stop moving."""
    return horizon.blockers(using=using, older_than=older_than)


def read_ordered(
    cursor,
    *,
    after: Checkpoint,
    xmin: int,
    category: str | None = None,
    types: Iterable[str | type[Event]] | None = None,
    partition: tuple[int, int, str, str] | None = None,
    limit: int,
) -> list[RecordedEvent]:
    """read_all() on a given cursor and snapshot xmin; ``partition`` is (index, count,
    key_source, key) for subscriptions."""
    if category is not None:
        validate_category(category)
    type_names = (
        None
        if types is None
        else sorted(t.pgmsg_type if isinstance(t, type) else str(t) for t in types)
    )
    index, count, key_source, key = partition or (0, 1, "stream", "")
    cursor.execute(
        QUERIES["read_ordered"],
        {
            "xid": str(after[0]),
            "position": after[1],
            "xmin": str(xmin),
            "category": category,
            "types": type_names,
            "partitions": count,
            "partition": index,
            "key_source": key_source,
            "key": key,
            "limit": limit,
        },
    )
    return RecordedEvent.from_rows(cursor.fetchall())


def checkpoint_of(position: int) -> Checkpoint:
    """The checkpoint just after the stored event at ``position`` (for replays)."""
    with connections[conf.get().DATABASE].cursor() as cursor:
        cursor.execute(QUERIES["checkpoint_of"], {"position": position})
        row = cursor.fetchone()
    if row is None:
        raise errors.PayloadError(f"no stored event has position {position!r}")
    return Checkpoint(int(row[0]), position)
