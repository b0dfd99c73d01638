"""notify(): send channel messages inside the caller's transaction."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connections

from pgmsg.channels import declarations as channels
from pgmsg.core import asynchrony, conf, errors, payload_encoders, payloads, sql, wire

QUERIES = sql.load(__package__, "notifications.sql")

#: notify()'s statement, its parameters in libpq's order; and the statement prepared on the
#: connection instead where pgmsg prepares.
_SEND = wire.Statement(QUERIES["send"], ["channel", "payload"], prepared=QUERIES["send_prepared"])
_SEND_MANY = wire.Statement(QUERIES["send_many"])

# PostgreSQL refuses NOTIFY payloads of 8000 bytes or more ("payload string too long").
MAX_BROADCAST_BYTES = 7999


def notify(message: channels.Channel, *, using: str | None = None) -> int | None:
    """Send ``message`` on its channel, in the current transaction of database ``using``.

    Nothing is delivered if the transaction rolls back. Exactly-once channels store the message
    and return its id; broadcast channels NOTIFY it (at most 7999 bytes of JSON) and return None.
    """
    spec = channels.spec_of(message)
    settings = conf.get()
    text = _encode(spec, message, validate=settings.VALIDATE_ON_SEND)
    db = connections[using or settings.DATABASE]
    if spec.delivery == channels.BROADCAST:
        _check_broadcast_size(spec, text)
        with db.cursor() as cursor:
            cursor.execute(
                QUERIES["broadcast"],
                {"notify_channel": channels.BROADCAST_PREFIX + spec.name, "payload": text},
            )
        return None
    return wire.send(db, _SEND, {"channel": spec.name, "payload": text})


def notify_many(messages: Iterable[channels.Channel], *, using: str | None = None) -> int:
    """Send many messages in one statement per delivery mode; returns how many were sent."""
    stored_channels, stored_payloads, broadcasts = [], [], []
    settings = conf.get()
    for message in messages:
        spec = channels.spec_of(message)
        text = _encode(spec, message, validate=settings.VALIDATE_ON_SEND)
        if spec.delivery == channels.BROADCAST:
            _check_broadcast_size(spec, text)
            broadcasts.append(
                {"notify_channel": channels.BROADCAST_PREFIX + spec.name, "payload": text}
            )
        else:
            stored_channels.append(spec.name)
            stored_payloads.append(text)
    db = connections[using or settings.DATABASE]
    if stored_channels:
        wire.send(db, _SEND_MANY, {"channels": stored_channels, "payloads": stored_payloads})
    if broadcasts:
        with db.cursor() as cursor:
            cursor.executemany(QUERIES["broadcast"], broadcasts)
    return len(stored_channels) + len(broadcasts)


anotify = asynchrony.awaitable(notify)
anotify_many = asynchrony.awaitable(notify_many)


def _encode(spec: channels.ChannelSpec, message: channels.Channel, *, validate: bool) -> str:
    text = payload_encoders.plain_encoder(spec.payload_class)(message)
    if text is not None:
        return text
    if validate:
        return payloads.dumps_checked(
            spec.payload_class, message, what=f"cannot send on channel {spec.name!r}"
        )
    return payloads.dumps(message)


def _check_broadcast_size(spec: channels.ChannelSpec, text: Any) -> None:
    size = len(text.encode())
    if size > MAX_BROADCAST_BYTES:
        raise errors.PayloadTooLarge(
            f"broadcast channel {spec.name!r}: payload is {size} bytes of JSON, PostgreSQL's "
            f"NOTIFY takes at most {MAX_BROADCAST_BYTES}; declare the channel with "
            "delivery='exactly_once' (the default) to send payloads of any size"
        )
