"""Named subscriptions to the event store: partitions, checkpoints, and the worker's source."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import Any, Literal

from django.db import connections, transaction

from pgmsg import channels, conf, errors, events, sql
from pgmsg import worker as wk
from pgmsg.events import Checkpoint, RecordedEvent

logger = logging.getLogger(__name__)

_SQL = sql.load("subscriptions.sql")

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
        channels.validate_name(self.name, kind="subscription")
        if self.category is not None:
            events.validate_category(self.category)
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
            key = _qualname(func)
            for name in names:
                funcs = self.handlers.setdefault(name, [])
                # A module imported twice must not register twice.
                funcs[:] = [f for f in funcs if _qualname(f) != key]
                funcs.append(func)
            return func

        return decorator

    @property
    def types(self) -> list[str] | None:
        """The event types to read (None: every type)."""
        if self.handlers.get(None):
            return None
        return sorted(name for name, funcs in self.handlers.items() if funcs)

    def dispatch(self, recorded: RecordedEvent) -> None:
        funcs = self.handlers.get(recorded.type, []) + self.handlers.get(None, [])
        if funcs and recorded.type in self.handlers:
            recorded.event  # noqa: B018  (decode now: a bad payload must fail before handlers)
        for func in funcs:
            func(recorded)


def _type_name(subscription: str, value: Any) -> str:
    if isinstance(value, str) and events._TYPE_RE.match(value):
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
    cursor.execute(_SQL["partition_count"], {"subscription": sub.name})
    count, highest = cursor.fetchone()
    if count == 0:
        cursor.execute(
            _SQL["create_partitions"],
            {"subscription": sub.name, "count": sub.partitions, "from_now": sub.start == "now"},
        )
    elif count != sub.partitions or highest != sub.partitions - 1:
        raise errors.ConfigurationError(
            f"subscription {sub.name!r} declares {sub.partitions} partitions but the database "
            f"holds {count} (up to index {highest}); changing the count would break ordering: "
            "use a new subscription name, or delete its rows from pgmsg_subscription_partition "
            "and let it start again"
        )


class SubscriptionSource:
    """One subscription (or a static share of its partitions), drained by the listen worker.

    Each partition is processed in its own transaction: lock the partition row (SKIP LOCKED:
    another worker holds it), read up to a batch of events after its checkpoint, run each
    event's handlers under a savepoint, and move the checkpoint in the same transaction.
    """

    def __init__(self, sub: Subscription, share: tuple[int, int] | None = None) -> None:
        self.sub = sub
        self.label = f"subscription:{sub.name}"
        part, parts = share or (0, 1)
        if parts > 1:
            self.label += f" (share {part}/{parts})"
        self.mine = [p for p in range(sub.partitions) if p % parts == part]
        self._ready = False

    def wants(self, wake_payload: str) -> bool:
        if self.sub.category is None:
            return wake_payload == WAKE_PREFIX or wake_payload.startswith(WAKE_PREFIX + ":")
        return wake_payload in (WAKE_PREFIX, f"{WAKE_PREFIX}:{self.sub.category}")

    def seconds_until_due(self, worker: wk.Worker) -> float | None:
        with connections[worker.database].cursor() as cursor:
            cursor.execute(
                _SQL["seconds_until_due"], {"subscription": self.sub.name, "partitions": self.mine}
            )
            return cursor.fetchone()[0]

    def process_batch(self, worker: wk.Worker) -> int:
        db = worker.database
        with connections[db].cursor() as cursor:
            if not self._ready:
                with transaction.atomic(using=db):
                    ensure_partitions(self.sub, cursor)
                self._ready = True
            cursor.execute(events._SQL["snapshot_xmin"])
            xmin = int(cursor.fetchone()[0])
            cursor.execute(
                _SQL["due_partitions"], {"subscription": self.sub.name, "partitions": self.mine}
            )
            rows = cursor.fetchall()
            if not rows:
                return 0
            due = [row[0] for row in rows]
            lowest = min(Checkpoint(row[1], row[2]) for row in rows)
            # One cheap look for the whole subscription before a transaction per partition:
            # when nothing it handles lies between its lowest checkpoint and the horizon,
            # every partition may move to the horizon at once.
            if not events.read_ordered(
                cursor,
                after=lowest,
                xmin=xmin,
                category=self.sub.category,
                types=self.sub.types,
                limit=1,
            ):
                cursor.execute(
                    _SQL["advance_idle"],
                    {
                        "subscription": self.sub.name,
                        "partitions": due,
                        "xid": xmin,
                        "low_xid": lowest.transaction_id,
                        "low_position": lowest.position,
                    },
                )
                return 0
        claimed = 0
        for partition in due:
            if worker.stopping:
                break
            claimed += self._process_partition(worker, partition)
        return claimed

    def _process_partition(self, worker: wk.Worker, partition: int) -> int:
        db, sub = worker.database, self.sub
        with transaction.atomic(using=db), connections[db].cursor() as cursor:
            # xmin first: locking the row gives this transaction an id, which would hold the
            # horizon back to itself.
            cursor.execute(events._SQL["snapshot_xmin"])
            xmin = int(cursor.fetchone()[0])
            cursor.execute(
                _SQL["lock_partition"], {"subscription": sub.name, "partition": partition}
            )
            row = cursor.fetchone()
            if row is None:
                return 0  # another worker holds it, or it is stopped or backing off
            id_, checkpoint_xid, checkpoint_position, attempts = row
            start = Checkpoint(checkpoint_xid, checkpoint_position)
            batch = events.read_ordered(
                cursor,
                after=start,
                xmin=xmin,
                category=sub.category,
                types=sub.types,
                partition=(partition, sub.partitions, sub.key_source, sub.key),
                limit=worker.batch_size,
            )
            reached, handled, failure = start, 0, None
            try:
                # The whole batch under one savepoint: a savepoint per event would cost two
                # round trips each.
                with transaction.atomic(using=db):
                    for recorded in batch:
                        if worker.stopping:
                            break
                        self._handle(recorded, attempts if handled == 0 else 0)
                        reached, handled = recorded.checkpoint, handled + 1
            except Exception:
                # A handler failed: its batch's writes are undone. Run the batch again event
                # by event, so that the events before the failing one commit and the failure
                # is pinned on the right event (handlers before it run a second time; their
                # writes count once).
                reached, handled = start, 0
                for recorded in batch:
                    if worker.stopping:
                        break
                    try:
                        with transaction.atomic(using=db):
                            self._handle(recorded, attempts if handled == 0 else 0)
                    except Exception as exc:
                        failure = (recorded, exc)
                        break
                    reached, handled = recorded.checkpoint, handled + 1
            complete = failure is None and handled == len(batch) < worker.batch_size
            if complete:
                # Every matching event of ended transactions was read: the next read may
                # start at the horizon instead of re-scanning other partitions' events.
                reached = max(reached, Checkpoint(xmin, 0))
            if failure is not None:
                self._fail(
                    cursor,
                    id_,
                    partition,
                    reached,
                    handled,
                    attempts if handled == 0 else 0,
                    *failure,
                )
            elif reached != start or handled or attempts:
                cursor.execute(
                    _SQL["advance"],
                    {
                        "id": id_,
                        "xid": reached.transaction_id,
                        "position": reached.position,
                        "handled": handled,
                    },
                )
        worker.handled += handled
        return len(batch)

    def _handle(self, recorded: RecordedEvent, attempts: int) -> None:
        delivery = wk.Delivery("event", recorded.position, self.sub.name, attempts)
        token, cause = wk._current.set(delivery), events._cause.set(recorded)
        try:
            self.sub.dispatch(recorded)
        finally:
            wk._current.reset(token)
            events._cause.reset(cause)

    def _fail(
        self,
        cursor,
        id_: int,
        partition: int,
        reached: Checkpoint,
        handled: int,
        attempts: int,
        recorded: RecordedEvent,
        exc: Exception,
    ) -> None:
        max_attempts = self.sub.max_attempts or conf.get().MAX_ATTEMPTS
        stop, text = wk.failure_outcome(exc, attempts, max_attempts)
        logger.warning(
            "pgmsg: subscription %r partition %s: event %s (%s v%s, %s) failed (attempt %s%s): %s",
            self.sub.name,
            partition,
            recorded.position,
            recorded.stream_name,
            recorded.version,
            recorded.type,
            attempts + 1,
            ", partition stopped" if stop else "",
            exc,
        )
        cursor.execute(
            _SQL["fail"],
            {
                "id": id_,
                "xid": reached.transaction_id,
                "position": reached.position,
                "handled": handled,
                "error": text,
                "failed_position": recorded.position,
                "stop": stop,
                "delay": 0.0 if stop else wk.retry_delay(attempts),
            },
        )


def worker_sources(options: wk.SourceOptions) -> list[SubscriptionSource]:
    """The listen worker's subscription sources: those named, or every one with a handler."""
    if options.subscriptions is not None:
        subs = []
        for name in options.subscriptions:
            sub = registry.get(name)
            if not any(sub.handlers.values()):
                raise errors.ConfigurationError(
                    f"subscription {name!r} has no handler registered; register one with "
                    f"@<subscription>.handler(EventClass)"
                )
            subs.append(sub)
    elif options.serve_all:
        subs = [s for s in registry.subscriptions.values() if any(s.handlers.values())]
    else:
        subs = []
    return [
        SubscriptionSource(sub, options.partition)
        for sub in sorted(set(subs), key=lambda s: s.name)
    ]


# -- operations ----------------------------------------------------------------------------------


def status(name: str | None = None) -> list:
    """The partition rows of one subscription (or all), ordered by name and partition."""
    from pgmsg.models import SubscriptionPartition

    rows = SubscriptionPartition.objects.using(conf.get().DATABASE).order_by(
        "subscription", "partition"
    )
    return list(rows.filter(subscription=name) if name is not None else rows)


def _partitions_arg(sub: Subscription, partitions: Iterable[int] | None) -> list[int]:
    if partitions is None:
        return list(range(sub.partitions))
    chosen = sorted(set(partitions))
    bad = [p for p in chosen if not (isinstance(p, int) and 0 <= p < sub.partitions)]
    if bad:
        raise errors.ConfigurationError(
            f"subscription {sub.name!r} has partitions 0..{sub.partitions - 1}, not {bad}"
        )
    return chosen


def _operate(statement: str, name: str, partitions: Iterable[int] | None, **params) -> int:
    sub = registry.get(name)
    db = conf.get().DATABASE
    with transaction.atomic(using=db), connections[db].cursor() as cursor:
        ensure_partitions(sub, cursor)
        cursor.execute(
            _SQL[statement],
            {"subscription": name, "partitions": _partitions_arg(sub, partitions), **params},
        )
        count = cursor.rowcount
        cursor.execute(_SQL["wake"], {"payload": WAKE_PREFIX})
    return count


def reset(
    name: str,
    *,
    to: int | Literal["beginning", "end"] = "beginning",
    partitions: Iterable[int] | None = None,
) -> int:
    """Move a subscription's partitions (default: all) to a point and make them active again:
    ``"beginning"`` (replay everything), ``"end"`` (pass over everything stored now), or a
    position (handle what is read after the event at that position). Waits for workers that
    hold a partition to commit. Returns the number of partitions moved."""
    if to == "beginning":
        point = events.START
    elif to == "end":
        point = None  # the horizon, computed in SQL
    elif isinstance(to, int) and not isinstance(to, bool) and to >= 0:
        point = events.checkpoint_of(to) if to else events.START
    else:
        raise errors.ConfigurationError(
            f"reset {name!r}: 'to' must be 'beginning', 'end' or a position, got {to!r}"
        )
    return _operate(
        "reset",
        name,
        partitions,
        to_end=point is None,
        xid=0 if point is None else point.transaction_id,
        position=0 if point is None else point.position,
    )


def retry(name: str, partitions: Iterable[int] | None = None) -> int:
    """Make stopped (or backing-off) partitions try their failed event again now."""
    return _operate("retry", name, partitions)


def skip(name: str, partitions: Iterable[int] | None = None) -> int:
    """Pass over the failed event of stopped (or retrying) partitions, and carry on after it."""
    return _operate("skip", name, partitions)
