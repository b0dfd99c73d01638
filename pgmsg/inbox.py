"""Transactional inbox: declarations, handlers, idempotent receive(), and the worker's source."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.core import checks
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections, transaction

from pgmsg import channels, conf, errors, sql
from pgmsg import worker as wk

logger = logging.getLogger(__name__)

_SQL = sql.load("inbox.sql")

#: NOTIFY payload on the wake channel for an inbox: "inbox:<name>" (see models/inbox.py).
WAKE_PREFIX = "inbox:"
#: Lowest and highest priority numbers (lower is handled first; unmapped types come last).
_PRIORITY_RANGE = (-(2**31) + 1, 2**31 - 2)


@dataclasses.dataclass(frozen=True)
class Inbox:
    """A named inbox. Declare it once, at import time (an app's ``listeners.py``)::

        payments = pgmsg.Inbox("payments", ordered=True, priorities={"refund": 0})

        @payments.handler("payment.captured")
        def captured(message: pgmsg.InboxMessage) -> None: ...

    ``ordered``: messages of one aggregate id are handled strictly in arrival order, by one
    worker at a time. ``priorities``: message type -> number, lower first, unmapped types last.
    ``max_attempts``: failed attempts before a message is dead (default PGMSG MAX_ATTEMPTS).
    """

    name: str
    ordered: bool = False
    max_attempts: int | None = None
    priorities: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        channels.validate_name(self.name, kind="inbox")
        if not isinstance(self.ordered, bool):
            raise errors.ConfigurationError(
                f"inbox {self.name!r}: ordered must be True or False, got {self.ordered!r}"
            )
        if self.max_attempts is not None and (
            not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool)
            or self.max_attempts < 1
        ):
            raise errors.ConfigurationError(
                f"inbox {self.name!r}: max_attempts must be a positive int, "
                f"got {self.max_attempts!r}"
            )
        low, high = _PRIORITY_RANGE
        for type_, priority in dict(self.priorities).items():
            if not isinstance(type_, str) or not type_:
                raise errors.ConfigurationError(
                    f"inbox {self.name!r}: priority keys are message types, got {type_!r}"
                )
            if not isinstance(priority, int) or isinstance(priority, bool) \
                    or not low <= priority <= high:
                raise errors.ConfigurationError(
                    f"inbox {self.name!r}: priority of {type_!r} must be an int in "
                    f"[{low}, {high}], got {priority!r}"
                )
        object.__setattr__(self, "priorities", dict(self.priorities))
        registry.add_inbox(self)

    def handler(self, *types: str) -> Callable[[Handler], Handler]:
        """Register the decorated function as the handler of these message types."""
        return handler(self.name, *types)

    def receive(self, message_id: str, **kwargs: Any) -> Received:
        """``receive(self.name, ...)``."""
        return receive(self.name, message_id, **kwargs)

    def __hash__(self) -> int:
        return hash(self.name)

    def make_source(self, partition: tuple[int, int] | None) -> InboxSource:
        """The worker's source for this inbox."""
        return InboxSource(self, partition)


@dataclasses.dataclass(frozen=True)
class InboxMessage:
    """What a handler receives."""

    #: Row id: the arrival position in the inbox table.
    id: int
    inbox: str
    #: The sender's id, the idempotency key.
    message_id: str
    type: str
    source: str
    aggregate_id: str | None
    payload: Any
    trace_id: str
    #: Failed attempts before this one (0 on the first delivery).
    attempts: int
    #: None for a model inbox (the model has no receipt time).
    received_at: dt.datetime | None


@dataclasses.dataclass(frozen=True)
class Received:
    """What receive() did: ``stored`` is False for a duplicate (the id was known)."""

    message_id: str
    stored: bool
    #: The new row's id, or None for a duplicate.
    id: int | None = None

    @property
    def duplicate(self) -> bool:
        return not self.stored


Handler = Callable[[InboxMessage], Any]


class Registry:
    """Inboxes by name, and the handler of each (inbox, message type)."""

    def __init__(self) -> None:
        self.inboxes: dict[str, Inbox] = {}
        self.handlers: dict[tuple[str, str], Handler] = {}

    def add_inbox(self, inbox: Inbox) -> None:
        known = self.inboxes.get(inbox.name)
        if known is not None and known != inbox:
            raise errors.InboxAlreadyDeclared(
                f"inbox {inbox.name!r} is declared twice with different options: "
                f"{known!r} and {inbox!r}"
            )
        self.inboxes[inbox.name] = inbox

    def get(self, name: str) -> Inbox:
        try:
            return self.inboxes[name]
        except KeyError:
            raise errors.UnknownInbox(
                f"no inbox named {name!r} is declared; known inboxes: {sorted(self.inboxes)}"
            ) from None

    def add_handler(self, inbox: str, type_: str, func: Handler) -> None:
        known = self.handlers.get((inbox, type_))
        # A module imported twice (autodiscovery and a test, say) registers the same function.
        if known is not None and _qualname(known) != _qualname(func):
            raise errors.ConfigurationError(
                f"inbox {inbox!r} type {type_!r} already has handler {_qualname(known)}; "
                f"refusing {_qualname(func)} (one handler per type)"
            )
        self.handlers[(inbox, type_)] = func

    def types(self, inbox: str) -> list[str]:
        return sorted(t for (name, t) in self.handlers if name == inbox)


def _qualname(func: Callable) -> str:
    return f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', repr(func))}"


registry = Registry()


def handler(inbox: Inbox | str, *types: str) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of ``types`` in ``inbox``.

    The handler runs inside the transaction that marks the message processed, under a
    savepoint: its writes and the processed mark commit together, or neither does.
    """
    name = inbox.name if isinstance(inbox, Inbox) else channels.validate_name(inbox, kind="inbox")
    if not types:
        raise errors.ConfigurationError(f"inbox {name!r}: name at least one message type")
    for type_ in types:
        if not isinstance(type_, str) or not type_:
            raise errors.ConfigurationError(
                f"inbox {name!r}: message types are non-empty strings, got {type_!r}"
            )

    def decorator(func: Handler) -> Handler:
        for type_ in types:
            registry.add_handler(name, type_, func)
        return func

    return decorator


# -- receiving -----------------------------------------------------------------------------


def receive(
    inbox: Inbox | str,
    message_id: str,
    *,
    type: str,
    payload: Any,
    source: str = "",
    aggregate_id: str | int | None = None,
    trace_id: str = "",
    using: str | None = None,
) -> Received:
    """Store a message in ``inbox`` unless ``message_id`` was received there before.

    Runs in the caller's transaction (nothing is stored if it rolls back). A concurrent receipt
    of the same id waits for the first transaction and then reports a duplicate.
    """
    name, row = _row(inbox, message_id, type, payload, source, aggregate_id, trace_id)
    with connections[using or conf.get().DATABASE].cursor() as cursor:
        cursor.execute(_SQL["receive"], {"inbox": name, **row})
        found = cursor.fetchone()
    return Received(row["message_id"], stored=found is not None, id=found and found[0])


def receive_many(
    inbox: Inbox | str, messages: Iterable[Mapping[str, Any]], *, using: str | None = None
) -> list[Received]:
    """Store many messages (mappings of receive()'s keywords) in one statement.

    Returns one Received per message, in order; a message id repeated within the batch is
    stored once (the first) and reported as a duplicate after that.
    """
    name = _inbox_name(inbox)
    rows = []
    for message in messages:
        unknown = set(message) - _RECEIVE_KEYS
        if unknown or "message_id" not in message:
            raise errors.InvalidMessage(
                f"inbox {name!r}: messages are mappings with keys {sorted(_RECEIVE_KEYS)} "
                f"(message_id, type and payload required); got {sorted(message)}"
            )
        _, row = _row(name, message["message_id"], message.get("type"),
                      message.get("payload", _MISSING), message.get("source", ""),
                      message.get("aggregate_id"), message.get("trace_id", ""))
        rows.append(row)
    if not rows:
        return []
    columns = {key: [r[key] for r in rows] for key in rows[0]}
    with connections[using or conf.get().DATABASE].cursor() as cursor:
        cursor.execute(_SQL["receive_many"], {
            "inbox": name, "message_ids": columns["message_id"], "types": columns["type"],
            "payloads": columns["payload"], "sources": columns["source"],
            "aggregate_ids": columns["aggregate_id"], "trace_ids": columns["trace_id"],
        })
        stored = dict(cursor.fetchall())
    results = []
    for row in rows:
        row_id = stored.pop(row["message_id"], None)
        results.append(Received(row["message_id"], stored=row_id is not None, id=row_id))
    return results


_RECEIVE_KEYS = {"message_id", "type", "payload", "source", "aggregate_id", "trace_id"}
_MISSING = object()


def _inbox_name(inbox: Inbox | str) -> str:
    if isinstance(inbox, Inbox):
        return inbox.name
    return registry.get(inbox).name


def _row(inbox, message_id, type_, payload, source, aggregate_id, trace_id):
    name = _inbox_name(inbox)
    for field, value in (("message_id", message_id), ("type", type_)):
        if not isinstance(value, str) or not value:
            raise errors.InvalidMessage(
                f"inbox {name!r}: {field} must be a non-empty string, got {value!r}"
            )
    for field, value in (("source", source), ("trace_id", trace_id)):
        if not isinstance(value, str):
            raise errors.InvalidMessage(f"inbox {name!r}: {field} must be a string, got {value!r}")
    if isinstance(aggregate_id, int) and not isinstance(aggregate_id, bool):
        aggregate_id = str(aggregate_id)
    if aggregate_id is not None and (not isinstance(aggregate_id, str) or not aggregate_id):
        raise errors.InvalidMessage(
            f"inbox {name!r}: aggregate_id must be a non-empty string, an int or None, "
            f"got {aggregate_id!r}"
        )
    if payload is _MISSING:
        raise errors.InvalidMessage(f"inbox {name!r}: message {message_id!r} has no payload")
    try:
        text = json.dumps(payload, cls=DjangoJSONEncoder, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise errors.InvalidMessage(
            f"inbox {name!r}: payload of message {message_id!r} is not JSON-serialisable: {exc}"
        ) from exc
    return name, {"message_id": message_id, "type": type_, "payload": text, "source": source,
                  "aggregate_id": aggregate_id, "trace_id": trace_id}


# -- processing ----------------------------------------------------------------------------

# Errors that retrying cannot mend: the message goes straight to the dead letters.
PERMANENT_ERRORS = (*wk.PERMANENT_ERRORS, errors.UnknownMessageType)


class InboxSource:
    """One inbox, drained by the listen worker (see pgmsg/worker.py for the loop)."""

    def __init__(self, inbox: Inbox, partition: tuple[int, int] | None = None) -> None:
        self.inbox = inbox
        self.label = WAKE_PREFIX + inbox.name
        self.part, self.parts = partition or (0, 1)
        if self.parts > 1:
            self.label += f" (share {self.part}/{self.parts})"
        self._wake = WAKE_PREFIX + inbox.name
        self._types = list(inbox.priorities)
        self._priorities = [inbox.priorities[t] for t in self._types]
        self._next_retention = 0.0

    def wants(self, wake_payload: str) -> bool:
        return wake_payload == self._wake

    def seconds_until_due(self, worker: wk.Worker) -> float | None:
        with connections[worker.database].cursor() as cursor:
            cursor.execute(_SQL["seconds_until_due"], {"inbox": self.inbox.name})
            return cursor.fetchone()[0]

    def process_batch(self, worker: wk.Worker) -> int:
        self._maybe_run_retention(worker)
        db = worker.database
        params = {"inbox": self.inbox.name, "types": self._types,
                  "priorities": self._priorities, "part": self.part, "parts": self.parts}
        done: list[int] = []
        failed: list[tuple] = []
        with transaction.atomic(using=db), connections[db].cursor() as cursor:
            claimed, more = 0, False
            if self.inbox.ordered:
                claimed, more = self._ordered(worker, cursor, params, done, failed)
            # Messages without an aggregate id (in an ordered inbox too) have no order to keep.
            room = worker.batch_size - claimed
            if room > 0 and not worker.stopping:
                claim = "claim_unordered" if self._types else "claim_unordered_fifo"
                cursor.execute(_SQL[claim], {
                    **params, "limit": room, "null_aggregate_only": self.inbox.ordered})
                rows = cursor.fetchall()
                claimed += len(rows)
                self._run(worker, rows, done, failed, ordered=False)
            if done:
                cursor.execute(_SQL["ack"], {"ids": done})
            if failed:
                ids, errs, delays, dead = zip(*failed, strict=True)
                cursor.execute(_SQL["fail"], {"ids": list(ids), "errors": list(errs),
                                              "delays": list(delays), "dead": list(dead)})
        worker.handled += len(done)
        return worker.batch_size if more else claimed

    def _ordered(self, worker, cursor, params, done, failed) -> tuple[int, bool]:
        """Handle the heads (and what follows) of aggregates that no other worker holds.

        Returns the rows claimed, and whether a locked aggregate may have more due now.
        """
        # Take a quarter batch of aggregates, up to four messages each (more when fewer are
        # free), so that other workers find aggregates to take too; look past the first
        # heads so that they can find the ones this worker does not hold.
        cursor.execute(_SQL["ordered_heads"], {**params, "limit": 4 * worker.batch_size})
        heads = [row[0] for row in cursor.fetchall()]
        if not heads:
            return 0, False
        lock_limit = math.ceil(worker.batch_size / 4)
        cursor.execute(_SQL["lock_aggregates"], {
            "inbox": self.inbox.name, "aggregates": heads, "limit": lock_limit})
        mine = [row[0] for row in cursor.fetchall()]
        if not mine:
            return 0, False
        # Due aggregates left for lack of room (not because another worker holds them).
        more = len(mine) == lock_limit and len(heads) > lock_limit
        per_aggregate = max(1, math.ceil(worker.batch_size / len(mine)))
        cursor.execute(_SQL["claim_ordered"], {"inbox": self.inbox.name, "aggregates": mine,
                                               "per_aggregate": per_aggregate})
        rows = cursor.fetchall()
        # Per aggregate, what may run now: the messages before the first dead or backing-off one.
        runnable, stopped, fetched = [], set(), {}
        for *row, status, due in rows:
            aggregate = row[4]
            fetched[aggregate] = fetched.get(aggregate, 0) + 1
            if aggregate in stopped or status != "pending" or not due:
                stopped.add(aggregate)
            else:
                runnable.append(row)
        self._run(worker, runnable, done, failed, ordered=True)
        more = more or any(n >= per_aggregate for a, n in fetched.items() if a not in stopped)
        return len(rows), more

    def _run(self, worker, rows: list, done: list, failed: list, *, ordered: bool) -> None:
        """Run the rows' handlers in order, inside the claim transaction.

        Fast path (as the worker's run_batch): one savepoint for the batch. If a handler
        raises, the batch's writes are rolled back and it runs again with a savepoint per
        message, so the failure is recorded and the others still commit; in an ordered inbox
        a failure holds back the rest of its aggregate. PGMSG SAVEPOINT_PER_MESSAGE turns the
        fast path off.
        """
        db = worker.database
        if not conf.get().SAVEPOINT_PER_MESSAGE:
            handled = []
            try:
                with transaction.atomic(using=db):
                    for row in rows:
                        if worker.stopping:
                            break  # unhandled rows stay pending; their locks go at commit
                        self._call(row)
                        handled.append(row[0])
            except wk._CONNECTION_ERRORS_STRICT:
                raise
            except Exception:
                pass  # rolled back: run again, one savepoint per message
            else:
                done.extend(handled)
                return
        blocked: set[str] = set()
        for row in rows:
            if worker.stopping:
                break
            if ordered and row[4] in blocked:
                continue
            try:
                with transaction.atomic(using=db):
                    self._call(row)
            except Exception as exc:
                failed.append(self._failure(row[0], row[1], row[7], exc))
                blocked.add(row[4])
            else:
                done.append(row[0])

    def _call(self, row: tuple) -> None:
        id_, type_, attempts = row[0], row[2], row[7]
        func = registry.handlers.get((self.inbox.name, type_))
        if func is None:
            raise errors.UnknownMessageType(
                f"inbox {self.inbox.name!r} has no handler for message type {type_!r}; "
                f"handled types: {registry.types(self.inbox.name)}"
            )
        token = wk._current.set(wk.Delivery("inbox", id_, self.inbox.name, attempts))
        try:
            func(self._message(row))
        finally:
            wk._current.reset(token)

    def _message(self, row: tuple) -> InboxMessage:
        (id_, message_id, type_, source, aggregate_id, text, trace_id, attempts,
         received_at) = row
        return InboxMessage(
            id=id_, inbox=self.inbox.name, message_id=message_id, type=type_, source=source,
            aggregate_id=aggregate_id, payload=json.loads(text), trace_id=trace_id,
            attempts=attempts, received_at=received_at,
        )

    def _failure(self, id_: int, message_id: str, attempts: int, exc: Exception) -> tuple:
        max_attempts = self.inbox.max_attempts or conf.get().MAX_ATTEMPTS
        permanent = isinstance(exc, PERMANENT_ERRORS)
        dead = permanent or attempts + 1 >= max_attempts
        text = wk.describe_error(exc)
        if permanent:
            text = "not retried: this message cannot succeed on a retry\n" + text
        logger.warning(
            "pgmsg: inbox %r message %r failed (attempt %s%s): %s",
            self.inbox.name, message_id, attempts + 1, ", now dead" if dead else "", exc,
        )
        return id_, text, 0.0 if dead else wk.retry_delay(attempts), dead

    def _maybe_run_retention(self, worker: wk.Worker) -> None:
        now = time.monotonic()
        if now < self._next_retention:
            return
        self._next_retention = now + conf.get().INBOX_RETENTION_INTERVAL
        from pgmsg import inbox_ops

        inbox_ops.purge([self.inbox.name], chunks=1)


@checks.register()
def check_handlers(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """Every inbox handler must name a declared inbox (a typo would otherwise never run)."""
    by_inbox: dict[str, list[str]] = {}
    for (name, type_), func in sorted(registry.handlers.items()):
        if name not in registry.inboxes:
            by_inbox.setdefault(name, []).append(f"{type_!r} ({_qualname(func)})")
    return [
        checks.Error(
            f"inbox handler(s) registered for undeclared inbox {name!r}: {', '.join(found)}",
            hint=f"declare it with pgmsg.Inbox({name!r}); declared inboxes: "
                 f"{sorted(registry.inboxes)}",
            id="pgmsg.E401",
        )
        for name, found in by_inbox.items()
    ]


def worker_sources(options: wk.SourceOptions) -> list[InboxSource]:
    """The listen worker's inbox sources: those named, or every inbox with a handler."""
    if options.inboxes is not None:
        names = []
        for name in options.inboxes:
            registry.get(name)  # raises UnknownInbox with the known names
            if not registry.types(name):
                raise errors.ConfigurationError(
                    f"inbox {name!r} has no handler registered; register one with "
                    f"@pgmsg.inbox_handler({name!r}, 'some.type')"
                )
            names.append(name)
    elif options.serve_all:
        names = [name for name in registry.inboxes if registry.types(name)]
    else:
        names = []
    return [registry.get(name).make_source(options.partition) for name in sorted(set(names))]


#: The decorator under the name pgmsg exports it as.
inbox_handler = handler
