"""Named subscriptions to the event store: declarations, handlers and their partitions."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any, Literal

from psycopg import sql as pgsql

from pgmsg.core import asynchrony, errors, horizon, locks, names, sql
from pgmsg.events import names as event_names
from pgmsg.events import store as events
from pgmsg.events.store import RecordedEvent

QUERIES = sql.load(__package__, "subscriptions.sql")
#: The CREATE FUNCTION template of a partition's read function (partition_read): the text of
#: pgmsg_read_partition (functions.sql) up to its read of the events, then that read with the
#: partition's bucket (subscriptions.sql, partition_read_events).
_READ_ONE = sql.functions(__package__)["pgmsg_read_partition"]
PARTITION_READ = (
    _READ_ONE[: _READ_ONE.index("    IF category_name IS NULL THEN\n")].replace(
        "FUNCTION pgmsg_read_partition(", "FUNCTION {name}(", 1
    )
    + QUERIES["partition_read_events"]
)

WAKE_PREFIX = "events"
#: Errors that retrying cannot mend: the partition stops at once.

Handler = Callable[[RecordedEvent], Any]


@dataclasses.dataclass(eq=False)
class Subscription:
    """A named, partitioned, checkpointed reader of one category (or of every event).

    ::

        ledger = pgmsg.Subscription("ledger", category="account", partitions=4)

        @ledger.handler(Deposited, Withdrawn)
        def project(recorded: pgmsg.RecordedEvent) -> None:
            ...

    Events go to one of ``partitions`` fixed buckets by a hash of the partition key:
    ``partition_by="stream"`` (the default: each stream stays in order), ``"data.<field>"`` or
    ``"metadata.<key>"``. Each bucket is handled in order by one worker at a time; buckets run
    in parallel. ``start``: ``"beginning"`` or ``"now"`` (events of transactions that ended
    before the subscription's partitions were first created are passed over). A handler that
    still fails after ``max_attempts`` (default PGMSG MAX_ATTEMPTS) stops its partition until
    an operator skips or retries (``manage.py pgmsg_subscriptions``).
    """

    name: str
    category: str | None = None
    partitions: int = 4
    partition_by: str = "stream"
    start: Literal["beginning", "now"] = "beginning"
    max_attempts: int | None = None
    #: Handlers by event type name; None holds the handlers of every type.
    handlers: dict[str | None, list[Handler]] = dataclasses.field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        names.validate_name(self.name, kind="subscription")
        if self.category is not None:
            event_names.validate_category(self.category)
        if not isinstance(self.partitions, int) or not 1 <= self.partitions <= 1024:
            raise errors.ConfigurationError(
                f"subscription {self.name!r}: partitions must be an int from 1 to 1024, "
                f"got {self.partitions!r}"
            )
        self.key_source, self.key = _parse_partition_by(self.name, self.partition_by)
        if self.start not in ("beginning", "now"):
            raise errors.ConfigurationError(
                f"subscription {self.name!r}: start must be 'beginning' or 'now', "
                f"got {self.start!r}"
            )
        if self.max_attempts is not None and (
            not isinstance(self.max_attempts, int) or self.max_attempts < 1
        ):
            raise errors.ConfigurationError(
                f"subscription {self.name!r}: max_attempts must be a positive int, "
                f"got {self.max_attempts!r}"
            )
        registry.add(self)

    def handler(self, *types: type[events.Event] | str) -> Callable[[Handler], Handler]:
        """Register the decorated function for these event types (none given: every type).

        It is called with the RecordedEvent (``.event`` is the typed event) inside the
        transaction that moves the partition's checkpoint.
        """
        names: list[str | None] = [
            t.pgmsg_type
            if isinstance(t, type) and issubclass(t, events.Event)
            else _type_name(self.name, t)
            for t in types
        ] or [None]

        def decorator(func: Handler) -> Handler:
            key, run = _qualname(func), asynchrony.in_worker_thread(func)
            for name in names:
                funcs = self.handlers.setdefault(name, [])
                # A module imported twice must not register twice.
                funcs[:] = [f for f in funcs if _qualname(f) != key]
                funcs.append(run)
            return func

        return decorator

    @property
    def types(self) -> list[str] | None:
        """The event types to read (None: every type)."""
        if self.handlers.get(None):
            return None
        return sorted(name for name, funcs in self.handlers.items() if funcs)

    def dispatch(self, recorded: RecordedEvent) -> None:
        # Called once per event read: no list built per call.
        typed = self.handlers.get(recorded.type)
        every = self.handlers.get(None)
        if typed is not None and (typed or every):
            recorded.event  # noqa: B018  (decode now: a bad payload must fail before handlers)
        if typed:
            for func in typed:
                func(recorded)
        if every:
            for func in every:
                func(recorded)


def _type_name(subscription: str, value: Any) -> str:
    if event_names.is_type_name(value):
        return value
    raise errors.ConfigurationError(
        f"subscription {subscription!r}: handler types must be Event subclasses or type names, "
        f"got {value!r}"
    )


def _parse_partition_by(name: str, value: Any) -> tuple[str, str]:
    if value == "stream":
        return "stream", ""
    if isinstance(value, str) and "." in value:
        source, key = value.split(".", 1)
        if source in ("data", "metadata") and key:
            return source, key
    raise errors.ConfigurationError(
        f"subscription {name!r}: partition_by must be 'stream', 'data.<field>' or "
        f"'metadata.<key>', got {value!r}"
    )


def _qualname(func: Callable) -> str:
    return f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', repr(func))}"


def _settings(sub: Subscription) -> tuple:
    return (sub.category, sub.partitions, sub.partition_by, sub.start, sub.max_attempts)


class Registry:
    def __init__(self) -> None:
        self.subscriptions: dict[str, Subscription] = {}

    def add(self, sub: Subscription) -> None:
        known = self.subscriptions.get(sub.name)
        if known is not None:
            if _settings(known) != _settings(sub):
                raise errors.ConfigurationError(
                    f"subscription {sub.name!r} is declared twice with different settings: "
                    f"{_settings(known)} and {_settings(sub)}"
                )
            sub.handlers = known.handlers  # a re-imported module re-declares the same thing
        self.subscriptions[sub.name] = sub

    def get(self, name: str) -> Subscription:
        try:
            return self.subscriptions[name]
        except KeyError:
            raise errors.UnknownSubscription(
                f"no subscription named {name!r} is declared; known subscriptions: "
                f"{sorted(self.subscriptions)}"
            ) from None


registry = Registry()


# -- partitions ----------------------------------------------------------------------------------


def ensure_partitions(sub: Subscription, cursor) -> None:
    """Create the subscription's partition rows if missing (each starting where ``start`` says).

    Changing the partition count of a subscription that has run would reorder events, so it
    is refused: reset the subscription under a new name, or delete its partition rows.
    """
    cursor.execute(QUERIES["partition_count"], {"subscription": sub.name})
    count, highest = cursor.fetchone()
    if count == 0:
        # "now" is the readers' own horizon, not the server-wide xmin, which a transaction of
        # another database holds back: starting there would replay what is stored already.
        start = horizon.horizon(cursor) if sub.start == "now" else 0
        cursor.execute(
            QUERIES["create_partitions"],
            {"subscription": sub.name, "count": sub.partitions, "xid": start},
        )
    elif count != sub.partitions or highest != sub.partitions - 1:
        raise errors.ConfigurationError(
            f"subscription {sub.name!r} declares {sub.partitions} partitions but the database "
            f"holds {count} (up to index {highest}); changing the count would break ordering: "
            "use a new subscription name, or delete its rows from pgmsg_subscription_partition "
            "and let it start again"
        )
    ensure_partition_reads(sub, cursor)


def partition_index(sub: Subscription) -> tuple[str, pgsql.Composed] | None:
    """The name and CREATE INDEX statement of the index that serves ``sub``'s partition reads
    (None for one partition: the category or read-order index serves it).

    Subscriptions with the same category (or none), partition key and count share one index.
    """
    if sub.partitions == 1:
        return None
    name = f"pgmsg_event_part_{sub.partitions}_{_digest(_index_shape(sub))}"
    statement = pgsql.SQL(QUERIES["create_partition_index"]).format(
        name=pgsql.Identifier(name),
        leading=pgsql.SQL("category, " if sub.category is not None else ""),
        key=_bucket_key(sub),
        partitions=pgsql.Literal(sub.partitions),
    )
    return name, statement


def read_function(sub: Subscription) -> str:
    """The name of the function through which ``sub``'s partitions are held and read
    (subscriptions.sql, read_partition): pgmsg_read_partition for one partition, the one
    partition_read makes for more."""
    if sub.partitions == 1:
        return "pgmsg_read_partition"
    # The function's text is part of its name: a pgmsg whose function differs makes its own.
    shape = _index_shape(sub) + PARTITION_READ
    return f"pgmsg_read_part_{sub.partitions}_{_digest(shape)}"


def partition_read(sub: Subscription) -> pgsql.Composed | None:
    """The CREATE FUNCTION statement of read_function(sub) (None for one partition:
    pgmsg_read_partition, events/functions.sql)."""
    if sub.partitions == 1:
        return None
    return pgsql.SQL(PARTITION_READ).format(
        name=pgsql.Identifier(read_function(sub)),
        category=pgsql.SQL("ev.category = category_name AND " if sub.category is not None else ""),
        key=_bucket_key(sub),
        partitions=pgsql.Literal(sub.partitions),
    )


def _bucket_key(sub: Subscription) -> pgsql.Composable:
    """The partition key as the bucket expression hashes it."""
    if sub.key_source == "stream":
        return pgsql.SQL("stream_name")
    return pgsql.SQL("coalesce({} ->> {}, '')").format(
        pgsql.Identifier(sub.key_source), pgsql.Literal(sub.key)
    )


def _index_shape(sub: Subscription) -> str:
    """What a partition index depends on: subscriptions of the same shape share it."""
    return f"{sub.category is not None}:{sub.key_source}:{sub.key}:{sub.partitions}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def ensure_partition_reads(sub: Subscription, cursor) -> None:
    """Create the index and the function of ``sub``'s partition reads where missing.

    Looked up first, so that a worker start does not lock the event table when they are
    there. Building the index on a large store blocks appends while it runs: create it
    beforehand with ``CREATE INDEX CONCURRENTLY`` (docs/events.md), or let the first worker
    build it at a quiet time.
    """
    index = partition_index(sub)
    if index is None:
        return
    name, statement = index
    function = read_function(sub)
    cursor.execute(QUERIES["partition_reads_exist"], {"index": name, "function": function})
    has_index, has_function = cursor.fetchone()
    if has_index and has_function:
        return
    cursor.execute(QUERIES["lock_partition_indexes"], {"lock_class": locks.PARTITION_READS})
    if not has_function:
        cursor.execute(partition_read(sub))
    if has_index:
        return
    cursor.execute(statement)
    # The planner knows how many events a bucket holds only from statistics of the index's
    # expression, which only ANALYZE gathers. Without them it guesses a handful, sorts instead
    # of reading the index in order, and each batch reads the partition's whole backlog: a
    # 1,000-event read took 15 ms instead of 3 on 100,000 events (bench/events.py).
    cursor.execute(QUERIES["analyze_events"])
