"""Bridges as PGMSG["INBOX_BRIDGES"] declares them: checked once, by name."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from pgmsg.core import broker_urls, conf, errors, names

#: Where a mapped field is looked for: a header (pgmsg's own, AMQP headers, NATS headers,
#: MQTT user properties), a broker property (AMQP message_id/type/..., a Redis entry's fields),
#: or a dotted path into the JSON body.
SOURCES = ("header", "property", "body")
#: Tried in order until one gives a value. pgmsg's own headers come first: a pgmsg outbox
#: sets them on every message (outbox/destinations/base.py, Envelope.broker_headers).
DEFAULT_MAPPING = {
    "message_id": ("header:pgmsg-message-id", "property:message_id", "header:Nats-Msg-Id"),
    "type": ("header:pgmsg-type", "property:type"),
    "aggregate_id": ("header:pgmsg-key", "property:key"),
    "trace_id": ("header:traceparent",),
}
#: A body larger than this (bytes) becomes a dead letter, unless a bridge says otherwise.
DEFAULT_MAX_BYTES = 1024 * 1024
#: Seconds between looks at the broker while nothing comes.
DEFAULT_POLL = 0.05
_KEYS = {"url", "topic", "inbox", "max_bytes", "poll", *DEFAULT_MAPPING}


@dataclasses.dataclass(frozen=True)
class Bridge:
    """One declared bridge: a broker URL (with the broker's options in its query), the queue,
    stream, subject or topic it consumes, the inbox it stores into, and the mapping."""

    name: str
    url: str
    topic: str
    inbox: str
    #: Field -> where to look, in order (``"header:NAME"``, ``"property:NAME"``,
    #: ``"body:a.b"``).
    mapping: Mapping[str, tuple[str, ...]]
    max_bytes: int
    poll: float

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme

    def describe(self) -> str:
        return f"{broker_urls.redact(self.url)} {self.topic}"


#: The URL schemes a bridge consumes from (brokers.py loads the module of each).
SCHEMES = ("amqp", "amqps", "nats", "tls", "redis", "rediss", "mqtt", "mqtts")


def declared() -> dict[str, Bridge]:
    """Every bridge of PGMSG["INBOX_BRIDGES"], checked (raises UnknownBridge)."""
    return {name: parse(name, value) for name, value in conf.get().INBOX_BRIDGES.items()}


def get(name: str) -> Bridge:
    found = conf.get().INBOX_BRIDGES
    if name not in found:
        raise errors.UnknownBridge(
            f"no bridge named {name!r} in PGMSG['INBOX_BRIDGES']; known: {sorted(found)}"
        )
    return parse(name, found[name])


def parse(name: Any, value: Any) -> Bridge:
    where = f"PGMSG['INBOX_BRIDGES'][{name!r}]"
    try:
        names.validate_name(name, kind="bridge")
    except errors.InvalidName as exc:
        raise errors.UnknownBridge(f"{where}: {exc}") from None
    if not isinstance(value, Mapping):
        raise errors.UnknownBridge(f"{where} must be a dict with url, topic and inbox")
    unknown = sorted(set(value) - _KEYS)
    if unknown:
        raise errors.UnknownBridge(f"{where}: unknown key(s) {unknown}; known: {sorted(_KEYS)}")
    for key in ("url", "topic", "inbox"):
        if not isinstance(value.get(key), str) or not value[key]:
            raise errors.UnknownBridge(f"{where}: {key} must be a non-empty string")
    scheme = urlsplit(value["url"]).scheme
    if scheme not in SCHEMES:
        raise errors.UnknownBridge(
            f"{where}: {broker_urls.redact(value['url'])} has scheme {scheme!r}; bridges "
            f"consume from {sorted(SCHEMES)}"
        )
    mapping = {}
    for field, default in DEFAULT_MAPPING.items():
        places = value.get(field, default)
        places = (places,) if isinstance(places, str) else tuple(places)
        for place in places:
            kind, _, path = str(place).partition(":")
            if kind not in SOURCES or not path:
                raise errors.UnknownBridge(
                    f"{where}: {field}: {place!r} must be 'header:NAME', 'property:NAME' "
                    "or 'body:dotted.path'"
                )
        mapping[field] = places
    max_bytes = value.get("max_bytes", DEFAULT_MAX_BYTES)
    poll = value.get("poll", DEFAULT_POLL)
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1:
        raise errors.UnknownBridge(f"{where}: max_bytes must be a positive int, got {max_bytes!r}")
    if not isinstance(poll, int | float) or isinstance(poll, bool) or not poll > 0:
        raise errors.UnknownBridge(f"{where}: poll must be a positive number, got {poll!r}")
    return Bridge(
        name=name,
        url=value["url"],
        topic=value["topic"],
        inbox=names.validate_name(value["inbox"], kind="inbox"),
        mapping=mapping,
        max_bytes=max_bytes,
        poll=float(poll),
    )
