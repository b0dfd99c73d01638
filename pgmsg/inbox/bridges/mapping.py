"""From a broker message to an inbox message, or to a dead letter saying why not."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from pgmsg.inbox.bridges.declarations import Bridge

#: The type of a dead letter the bridge could not map: no handler runs it by mistake when it
#: is replayed (the inbox's usual handling of an unknown type), and it says where it came from.
REJECTED_TYPE = "pgmsg.bridge.rejected"
#: How much of an oversized body its dead letter keeps.
KEPT_OF_OVERSIZED = 4096
#: A JSON escape of NUL (not itself an escaped backslash): jsonb refuses it, so such a body
#: would fail its whole batch's store instead of becoming its own dead letter.
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


@dataclasses.dataclass(frozen=True)
class Delivery:
    """One message as a broker handed it to a bridge."""

    body: bytes | None
    #: Headers (pgmsg's own among them when a pgmsg outbox sent it): AMQP headers, NATS
    #: headers, MQTT user properties, a Redis entry's ``headers`` field.
    headers: Mapping[str, str]
    #: The broker's own fields: AMQP message_id, type, ...; a Redis entry's other fields.
    properties: Mapping[str, str]
    #: The message's stable place in the broker ("" where there is none): a Redis entry id, a
    #: JetStream stream sequence. A dead letter without an id is named after it.
    position: str
    #: What acknowledging it needs (a delivery tag, an entry id, a NATS message, an MQTT mid).
    token: Any = None


@dataclasses.dataclass(frozen=True)
class Rejected:
    """A message that goes in as a dead letter: ``reason`` and the raw body kept."""

    message_id: str
    type: str
    payload: str
    reason: str


def convert(bridge: Bridge, delivery: Delivery) -> dict[str, Any] | Rejected:
    """receive_many()'s mapping for ``delivery``, or why it is a dead letter."""
    body = delivery.body
    if body is None:
        return _rejected(bridge, delivery, None, "the message has no body")
    if len(body) > bridge.max_bytes:
        return _rejected(
            bridge,
            delivery,
            None,
            f"body of {len(body)} bytes is over the bridge's max_bytes ({bridge.max_bytes})",
            kept=body[:KEPT_OF_OVERSIZED],
        )
    try:
        payload = json.loads(body, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        return _rejected(bridge, delivery, None, f"the body is not JSON: {exc}")
    if b"\\u0000" in body and _NUL_ESCAPE.search(body):
        return _rejected(
            bridge, delivery, None, "the body holds \\u0000, which PostgreSQL's jsonb refuses"
        )
    found = {field: _find(bridge, delivery, payload, field) for field in bridge.mapping}
    if not found["message_id"]:
        return _rejected(
            bridge,
            delivery,
            payload,
            f"no message id (looked at {', '.join(bridge.mapping['message_id'])})",
        )
    if not found["type"]:
        return _rejected(
            bridge,
            delivery,
            payload,
            f"message {found['message_id']!r} has no type "
            f"(looked at {', '.join(bridge.mapping['type'])})",
        )
    return {
        "message_id": found["message_id"],
        "type": found["type"],
        "payload": payload,
        "source": f"bridge:{bridge.name}",
        "aggregate_id": found["aggregate_id"] or None,
        "trace_id": found["trace_id"] or "",
    }


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value PostgreSQL stores")


def _find(bridge: Bridge, delivery: Delivery, payload: Any, field: str) -> str:
    for place in bridge.mapping[field]:
        kind, _, path = place.partition(":")
        if kind == "header":
            value = _lookup(delivery.headers, path)
        elif kind == "property":
            value = delivery.properties.get(path)
        else:
            value = payload
            for step in path.split("."):
                value = value.get(step) if isinstance(value, dict) else None
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if isinstance(value, str) and value and "\0" not in value:
            return value
    return ""


def _lookup(headers: Mapping[str, Any], name: str) -> Any:
    if name in headers:
        return headers[name]
    lowered = name.lower()  # HTTP-style header names are case-insensitive
    return next((v for k, v in headers.items() if str(k).lower() == lowered), None)


def _rejected(
    bridge: Bridge, delivery: Delivery, payload: Any, reason: str, *, kept: bytes | None = None
) -> Rejected:
    raw = delivery.body if kept is None else kept
    # The id from the headers or properties (or the body, when it was read): a reject the
    # broker delivers again is then found and skipped.
    message_id = _find(bridge, delivery, payload if payload is not None else {}, "message_id")
    if not message_id:
        message_id = _stable_id(bridge, delivery)
    kept_text = None if raw is None else _text(raw)
    record = {
        "reason": _storable(reason),
        "raw_body": kept_text,
        "body_bytes": None if delivery.body is None else len(delivery.body),
        "headers": {_text(k): _text(v) for k, v in delivery.headers.items()},
        "properties": {_text(k): _text(v) for k, v in delivery.properties.items()},
        "position": delivery.position,
    }
    return Rejected(
        message_id=message_id,
        type=REJECTED_TYPE,
        payload=json.dumps(record),
        reason=_storable(f"bridge {bridge.name!r}: {reason}"),
    )


def _stable_id(bridge: Bridge, delivery: Delivery) -> str:
    """Named after the broker's place of the message, else its content: a redelivered reject
    finds its first copy and is skipped."""
    if delivery.position:
        return f"{bridge.name}:{delivery.position}"
    digest = hashlib.sha256(delivery.body or b"")
    for key in sorted(delivery.headers):
        digest.update(f"\0{key}={delivery.headers[key]}".encode())
    return f"{bridge.name}:sha256:{digest.hexdigest()[:32]}"


def _text(value: Any) -> str:
    text = value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else str(value)
    return _storable(text)


def _storable(text: str) -> str:
    """NUL written out: PostgreSQL's text and jsonb refuse it, and a dead letter must store."""
    return text.replace("\0", "\\x00")
