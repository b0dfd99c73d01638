"""Transactional inbox: declarations, handlers, idempotent receive(), the worker's sources."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.core import checks
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections

from pgmsg.core import asynchrony, conf, errors, names, schema, sql, wire

logger = logging.getLogger(__name__)

QUERIES = sql.load(__package__, "inbox.sql")

#: receive()'s statement, its parameters in libpq's order.
_RECEIVE = wire.Statement(
    QUERIES["receive"],
    ["inbox", "message_id", "type", "payload", "source", "aggregate_id", "trace_id"],
)

#: receive_many()'s statement: its arrays bound on the server, in binary (wire.rows).
_RECEIVE_MANY = wire.Statement(QUERIES["receive_many"])

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
        names.validate_name(self.name, kind="inbox")
        if not isinstance(self.ordered, bool):
            raise errors.ConfigurationError(
                f"inbox {self.name!r}: ordered must be True or False, got {self.ordered!r}"
            )
        if self.max_attempts is not None and (
            not isinstance(self.max_attempts, int)
            or isinstance(self.max_attempts, bool)
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
            if (
                not isinstance(priority, int)
                or isinstance(priority, bool)
                or not low <= priority <= high
            ):
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
    name = inbox.name if isinstance(inbox, Inbox) else names.validate_name(inbox, kind="inbox")
    if not types:
        raise errors.ConfigurationError(f"inbox {name!r}: name at least one message type")
    for type_ in types:
        if not isinstance(type_, str) or not type_:
            raise errors.ConfigurationError(
                f"inbox {name!r}: message types are non-empty strings, got {type_!r}"
            )

    def decorator(func: Handler) -> Handler:
        run = asynchrony.in_worker_thread(func)
        for type_ in types:
            registry.add_handler(name, type_, run)
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
    stored = wire.send(connections[using or conf.get().DATABASE], _RECEIVE, {"inbox": name, **row})
    return Received(row["message_id"], stored=stored is not None, id=stored)


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
        _, row = _row(
            name,
            message["message_id"],
            message.get("type"),
            message.get("payload", _MISSING),
            message.get("source", ""),
            message.get("aggregate_id"),
            message.get("trace_id", ""),
        )
        rows.append(row)
    if not rows:
        return []
    columns = {key: [r[key] for r in rows] for key in rows[0]}
    db = connections[using or conf.get().DATABASE]
    with schema.translated(db.alias):
        found = wire.rows(
            db,
            _RECEIVE_MANY,
            {
                "inbox": name,
                "message_ids": columns["message_id"],
                "types": columns["type"],
                "payloads": columns["payload"],
                "sources": columns["source"],
                "aggregate_ids": columns["aggregate_id"],
                "trace_ids": columns["trace_id"],
            },
        )
    stored = dict(found)
    results = []
    for row in rows:
        row_id = stored.pop(row["message_id"], None)
        results.append(Received(row["message_id"], stored=row_id is not None, id=row_id))
    return results


areceive = asynchrony.awaitable(receive)
areceive_many = asynchrony.awaitable(receive_many)

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
    return name, {
        "message_id": message_id,
        "type": type_,
        "payload": text,
        "source": source,
        "aggregate_id": aggregate_id,
        "trace_id": trace_id,
    }


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


#: The decorator under the name pgmsg exports it as.
inbox_handler = handler
