"""Outbox declarations, typed outbox messages, and publish(): write in the caller's transaction."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections

from pgmsg.core import (
    asynchrony,
    conf,
    errors,
    locks,
    names,
    payload_types,
    payloads,
    schema,
    sql,
    wire,
)
from pgmsg.core.ids import uuid7
from pgmsg.outbox import slots

QUERIES = sql.load(__package__, "outbox.sql")
#: publish()'s statement for a table outbox (no libpq form: the ladder's cursor rungs).
_PUBLISH = wire.Statement(QUERIES["publish"])

#: Keys and header names longer than this are refused (they travel in every broker message).
MAX_KEY_LENGTH = 1000
#: Header names pgmsg sets itself on every published message.
RESERVED_HEADER_PREFIX = "pgmsg-"
MAX_PARTITIONS = 1024
#: How a relay finds new messages: "table" (rows, any PostgreSQL) or "logical" (WAL messages
#: read from a replication slot, wal_level = logical): docs/outbox.md.
CAPTURE_MODES = ("table", "logical")

T = TypeVar("T", bound=type)


@dataclasses.dataclass(frozen=True)
class Outbox:
    """A named outbox toward one destination. Declare it once, at import time::

        orders = pgmsg.Outbox("orders", destination="rabbit")

        @orders.message("order.placed", topic="orders.placed")
        class OrderPlaced:
            order_id: int
            total: Decimal

        pgmsg.publish(OrderPlaced(order_id=1, total=Decimal("9.90")), key="order-1")

    ``destination``: a name in PGMSG["OUTBOX_DESTINATIONS"]. ``partitions``: how many parts
    the messages are hashed into (by key, or by message id when there is none); each part is
    published by one relay at a time. ``max_attempts``: refusals before a message is dead
    (default PGMSG MAX_ATTEMPTS). ``capture``: "table" (the default) or "logical" (messages
    travel in the WAL and the relay reads a replication slot; one partition).
    """

    name: str
    destination: str
    partitions: int = 1
    max_attempts: int | None = None
    capture: str = "table"

    def __post_init__(self) -> None:
        names.validate_name(self.name, kind="outbox")
        names.validate_name(self.destination, kind="destination")
        for field, value, top in (
            ("partitions", self.partitions, MAX_PARTITIONS),
            ("max_attempts", self.max_attempts, None),
        ):
            if value is None and field == "max_attempts":
                continue
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or value < 1
                or (top and value > top)
            ):
                raise errors.ConfigurationError(
                    f"outbox {self.name!r}: {field} must be a positive int"
                    f"{f' up to {top}' if top else ''}, got {value!r}"
                )
        if self.capture not in CAPTURE_MODES:
            raise errors.ConfigurationError(
                f"outbox {self.name!r}: capture must be one of {CAPTURE_MODES}, "
                f"got {self.capture!r}"
            )
        if self.capture == "logical" and self.partitions != 1:
            raise errors.ConfigurationError(
                f"outbox {self.name!r}: capture='logical' reads one replication slot, which one "
                f"relay reads at a time: partitions must be 1, got {self.partitions!r}"
            )
        registry.add_outbox(self)

    def message(self, type: str, *, topic: str | None = None) -> Callable[[T], T]:
        """Declare the decorated class (made a dataclass) as a message type of this outbox.

        Its fields are the payload, checked like a channel's; ``topic`` (default: ``type``)
        is the routing key, subject, stream or MQTT topic it is published to.
        """
        _check_text("type", type, self.name)
        topic = type if topic is None else topic
        _check_text("topic", topic, self.name)

        def decorator(cls: T) -> T:
            if not dataclasses.is_dataclass(cls):
                cls = dataclasses.dataclass(cls)
            payload_types.check_supported(cls)
            spec = MessageSpec(outbox=self, type=type, topic=topic, payload_class=cls)
            registry.add_message(spec)
            cls.pgmsg_outbox_message = spec
            return cls

        return decorator

    def publish(self, type: str, payload: Any, **kwargs: Any) -> Published:
        """Publish an untyped JSON ``payload`` as message ``type``: see pgmsg.publish()."""
        return publish(self, payload, type=type, **kwargs)

    def forward(self, subscription: Any, *types: Any, topic: str | None = None) -> Any:
        """Publish every event ``subscription`` reads (or those of ``types``) to this outbox::

            orders.forward(pgmsg.Subscription("orders-out", category="order"))

        The subscription's handler writes the outbox row in the transaction that moves its
        checkpoint, so each event is written once, and keyed by its stream (one stream's events
        reach the broker in order). The message id is the event's; the type is the event
        type; ``topic`` defaults to it; headers ``event-stream``, ``event-version`` and
        ``event-position`` say where it was stored. Returns the subscription.
        """
        if topic is not None:
            _check_text("topic", topic, self.name)

        def forward(recorded: Any) -> None:
            publish(
                self,
                recorded.data,
                type=recorded.type,
                topic=topic or recorded.type,
                key=recorded.stream_name,
                message_id=str(recorded.message_id),
                headers={
                    "event-stream": recorded.stream_name,
                    "event-version": str(recorded.version),
                    "event-position": str(recorded.position),
                },
            )

        forward.__qualname__ = f"forward_to_outbox[{self.name}]"
        subscription.handler(*types)(forward)
        return subscription

    def __hash__(self) -> int:
        return hash(self.name)


@dataclasses.dataclass(frozen=True)
class MessageSpec:
    """A declared message type: its outbox, type name, default topic and payload class."""

    outbox: Outbox
    type: str
    topic: str
    payload_class: type


@dataclasses.dataclass(frozen=True)
class Published:
    """What publish() wrote: ``stored`` is False when the message id was pending already."""

    message_id: str
    stored: bool
    #: The row's id (its place in the outbox), or None for a duplicate.
    id: int | None = None


class Registry:
    """Outboxes by name, and the declared message types of each."""

    def __init__(self) -> None:
        self.outboxes: dict[str, Outbox] = {}
        self.messages: dict[tuple[str, str], MessageSpec] = {}

    def add_outbox(self, outbox: Outbox) -> None:
        known = self.outboxes.get(outbox.name)
        if known is not None and known != outbox:
            raise errors.OutboxAlreadyDeclared(
                f"outbox {outbox.name!r} is declared twice with different options: "
                f"{known!r} and {outbox!r}"
            )
        self.outboxes[outbox.name] = outbox

    def add_message(self, spec: MessageSpec) -> None:
        key = (spec.outbox.name, spec.type)
        known = self.messages.get(key)
        # A module imported twice declares the same class again; that is the same declaration.
        if known is not None and _qualname(known.payload_class) != _qualname(spec.payload_class):
            raise errors.OutboxAlreadyDeclared(
                f"outbox {spec.outbox.name!r} message type {spec.type!r} is declared by "
                f"{_qualname(known.payload_class)} already; refusing "
                f"{_qualname(spec.payload_class)}"
            )
        self.messages[key] = spec

    def get(self, name: str) -> Outbox:
        try:
            return self.outboxes[name]
        except KeyError:
            raise errors.UnknownOutbox(
                f"no outbox named {name!r} is declared; known outboxes: {sorted(self.outboxes)}"
            ) from None


def _qualname(cls: Any) -> str:
    return f"{getattr(cls, '__module__', '')}.{getattr(cls, '__qualname__', repr(cls))}"


registry = Registry()


# -- publishing ----------------------------------------------------------------------------

_MISSING = object()


def publish(
    message: Any,
    payload: Any = _MISSING,
    *,
    type: str | None = None,
    topic: str | None = None,
    key: str | int | None = None,
    headers: Mapping[str, str] | None = None,
    message_id: str | uuid.UUID | None = None,
    using: str | None = None,
) -> Published:
    """Write a message to its outbox in the current transaction of database ``using``.

    Typed: ``publish(OrderPlaced(...), key=...)``, an instance of a class declared with
    ``@outbox.message(type)``. Untyped: ``publish("orders", {...}, type="order.placed")``
    (an outbox or its name, then a JSON payload). Nothing is published if the transaction
    rolls back. ``key``: messages of one key reach the broker in commit order (a second
    transaction publishing to the same key waits for the first to end). ``message_id``
    (default: a new UUID) is what brokers see and deduplicate on; a message id that is still
    pending in the outbox is not written twice (``Published.stored`` is False).

    A logical outbox (``capture="logical"``) writes a WAL message instead of a row: no key lock
    (commit order comes with decoding), no duplicate check (``stored`` is always True, ``id``
    None), and ReplicationSlotMissing until its relay has created the slot.
    """
    row = _row(message, payload, type, topic, key, headers, message_id)
    using = using or conf.get().DATABASE
    if row["capture"] == "logical":
        with schema.translated(using), connections[using].cursor() as cursor:
            slots.emit(cursor, row["outbox"], row, using=using)
        return Published(row["message_id"], stored=True)
    # No row: a message id still held.
    stored = wire.send(connections[using], _PUBLISH, {**row, "lock_space": locks.OUTBOX})
    return Published(row["message_id"], stored=stored is not None, id=stored)


def publish_many(messages: Iterable[Any], *, using: str | None = None) -> list[Published]:
    """Publish many typed messages (instances, or ``(instance, {"key": ..., ...})`` pairs with
    publish()'s keywords) in one statement per table outbox (one per message of a logical
    outbox); one Published each, in order."""
    by_outbox: dict[str, list[dict]] = {}
    rows = []
    for item in messages:
        instance, options = item if isinstance(item, tuple) else (item, {})
        unknown = set(options) - {"topic", "key", "headers", "message_id"}
        if unknown:
            raise errors.InvalidOutboxMessage(
                f"publish_many: unknown option(s) {sorted(unknown)} for {instance!r}"
            )
        row = _row(
            instance,
            _MISSING,
            None,
            options.get("topic"),
            options.get("key"),
            options.get("headers"),
            options.get("message_id"),
        )
        rows.append(row)
        by_outbox.setdefault(row["outbox"], []).append(row)
    stored: dict[tuple[str, str], int] = {}
    using = using or conf.get().DATABASE
    with schema.translated(using), connections[using].cursor() as cursor:
        for name, group in by_outbox.items():
            if group[0]["capture"] == "logical":
                for row in group:  # in order: one WAL message each
                    slots.emit(cursor, name, row, using=using)
                    stored[(name, row["message_id"])] = 0
                continue
            cursor.execute(
                QUERIES["publish_many"],
                {
                    "outbox": name,
                    "lock_space": locks.OUTBOX,
                    "destination": group[0]["destination"],
                    "message_ids": [r["message_id"] for r in group],
                    "topics": [r["topic"] for r in group],
                    "types": [r["type"] for r in group],
                    "keys": [r["key"] for r in group],
                    "payloads": [r["payload"] for r in group],
                    "headers": [r["headers"] for r in group],
                },
            )
            stored.update({(name, mid): id_ for mid, id_ in cursor.fetchall()})
    results = []
    for row in rows:
        id_ = stored.pop((row["outbox"], row["message_id"]), None)
        results.append(Published(row["message_id"], stored=id_ is not None, id=id_ or None))
    return results


apublish = asynchrony.awaitable(publish)
apublish_many = asynchrony.awaitable(publish_many)


def _row(message, payload, type_, topic, key, headers, message_id) -> dict[str, Any]:
    spec = getattr(type(message), "pgmsg_outbox_message", None)
    if isinstance(spec, MessageSpec) and spec.payload_class is type(message):
        if payload is not _MISSING or type_ is not None:
            raise errors.InvalidOutboxMessage(
                f"publish({message!r}): a typed message carries its own payload and type; "
                "pass neither"
            )
        outbox, type_, text = spec.outbox, spec.type, payloads.dumps(message)
        if conf.get().VALIDATE_ON_SEND:
            # A value the declared type cannot carry (order_id="x" for an int) fails here, in
            # the publishing code, as it does for channels and events.
            payloads.check_decodes(
                spec.payload_class, text, what=f"cannot publish {spec.type!r} to {outbox.name!r}"
            )
        topic = spec.topic if topic is None else topic
    elif isinstance(message, Outbox | str):
        outbox = message if isinstance(message, Outbox) else registry.get(message)
        if payload is _MISSING:
            raise errors.InvalidOutboxMessage(
                f"outbox {outbox.name!r}: publish(outbox, payload, type=...) needs a payload"
            )
        _check_text("type", type_, outbox.name)
        topic = type_ if topic is None else topic
        try:
            text = json.dumps(payload, cls=DjangoJSONEncoder, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise errors.InvalidOutboxMessage(
                f"outbox {outbox.name!r}: payload of {type_!r} is not JSON-serialisable: {exc}"
            ) from exc
    else:
        raise errors.InvalidOutboxMessage(
            f"cannot publish {message!r}: pass an instance of a class declared with "
            "@outbox.message(...), or an outbox (or its name) and a payload"
        )
    _check_text("topic", topic, outbox.name)
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)
    if key is not None:
        _check_text("key", key, outbox.name)
    if message_id is None:
        message_id = str(uuid7())
    elif isinstance(message_id, uuid.UUID):
        message_id = str(message_id)
    _check_text("message_id", message_id, outbox.name)
    return {
        "outbox": outbox.name,
        "capture": outbox.capture,
        "destination": outbox.destination,
        "message_id": message_id,
        "topic": topic,
        "type": type_,
        "key": key,
        "payload": text,
        "headers": json.dumps(_headers(outbox.name, headers)),
    }


def _check_text(field: str, value: Any, outbox: str) -> None:
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_LENGTH or "\0" in value:
        raise errors.InvalidOutboxMessage(
            f"outbox {outbox!r}: {field} must be a non-empty string of at most "
            f"{MAX_KEY_LENGTH} characters, got {value!r}"
        )


def _headers(outbox: str, headers: Mapping[str, str] | None) -> dict[str, str]:
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise errors.InvalidOutboxMessage(
            f"outbox {outbox!r}: headers must be a mapping of str to str, got {headers!r}"
        )
    for name, value in headers.items():
        _check_text("header name", name, outbox)
        if name.lower().startswith(RESERVED_HEADER_PREFIX):
            raise errors.InvalidOutboxMessage(
                f"outbox {outbox!r}: header {name!r}: names starting with "
                f"{RESERVED_HEADER_PREFIX!r} are set by pgmsg"
            )
        if not isinstance(value, str):
            raise errors.InvalidOutboxMessage(
                f"outbox {outbox!r}: header {name!r} must be a string, got {value!r}"
            )
    return dict(headers)
