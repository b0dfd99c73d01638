"""What every destination shares: the envelope it publishes, and the outcome of a publish."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pgmsg.core import errors

#: The outcome of one message: None (the broker confirmed it), MessageRefused (the broker
#: answered no: retried with backoff, then dead) or BrokerUnavailable (nothing is known: kept,
#: published again once the broker is back, no attempt counted).
Outcome = errors.MessageRefused | errors.BrokerUnavailable | None


@dataclasses.dataclass(frozen=True)
class Envelope:
    """A message as a destination publishes it."""

    #: The outbox row id.
    id: int
    outbox: str
    #: The stable id: AMQP message_id, Nats-Msg-Id, the message_id field of a stream entry.
    message_id: str
    destination: str
    topic: str
    type: str
    key: str | None
    #: The JSON text of the payload.
    payload: str
    #: The producer's headers (without pgmsg's own; see broker_headers()).
    headers: dict[str, str]
    #: Refusals before this attempt (0 on the first).
    attempts: int
    created_at: dt.datetime

    @property
    def body(self) -> bytes:
        return self.payload.encode()

    def broker_headers(self) -> dict[str, str]:
        """The producer's headers plus pgmsg's: message id, type, outbox, key, and the
        redelivery counter (refusals so far)."""
        found = dict(self.headers)
        found["pgmsg-message-id"] = self.message_id
        found["pgmsg-type"] = self.type
        found["pgmsg-outbox"] = self.outbox
        if self.key is not None:
            found["pgmsg-key"] = self.key
        found["pgmsg-redelivery-count"] = str(self.attempts)
        return found


class Destination(Protocol):
    """A connection to one broker (or a callable), made lazily and kept by the relay."""

    name: str

    def publish(self, envelopes: Sequence[Envelope]) -> list[Outcome]:
        """Publish ``envelopes`` (no two of one key) and wait for the broker's confirmations;
        one outcome each, in order. May raise BrokerUnavailable for the whole group."""

    def close(self) -> None:
        """Drop the connection (the next publish makes a new one)."""


def split_options(url: str, known: dict[str, str]) -> tuple[str, dict[str, str]]:
    """Take pgmsg's own query options (``known``: name -> default) out of ``url``.

    Returns the URL without them (for the client library) and the options' values.
    """
    parts = urlsplit(url)
    rest, options = [], dict(known)
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in known:
            options[name] = value
        else:
            rest.append((name, value))
    return urlunsplit(parts._replace(query=urlencode(rest))), options


def flag(value: str, *, option: str, url: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise errors.UnknownDestination(f"{redact(url)}: {option} must be 1 or 0, got {value!r}")


def seconds(value: str, *, option: str, url: str) -> float:
    try:
        found = float(value)
    except ValueError:
        found = -1.0
    if not found > 0:
        raise errors.UnknownDestination(
            f"{redact(url)}: {option} must be a positive number of seconds, got {value!r}"
        )
    return found


def redact(url: str) -> str:
    """The URL with its password hidden, for messages and logs."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def short(exc: BaseException) -> str:
    """One line naming the exception: what a log line or a dead letter carries."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else repr(exc)}"
