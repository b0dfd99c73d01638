"""What every destination shares: the envelope it publishes, and the outcome of a publish."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Protocol

from pgmsg.core import broker_urls, errors

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
    """Take pgmsg's own query options (``known``: name -> default) out of ``url``."""
    return broker_urls.split_options(url, known)


def flag(value: str, *, option: str, url: str) -> bool:
    return broker_urls.flag(value, option=option, url=url, error=errors.UnknownDestination)


def seconds(value: str, *, option: str, url: str) -> float:
    return broker_urls.seconds(value, option=option, url=url, error=errors.UnknownDestination)


#: The URL with its password hidden; one line naming an exception (core/broker_urls.py).
redact = broker_urls.redact
short = broker_urls.short
