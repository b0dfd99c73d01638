"""What each broker's module gives a bridge: a consumer that fetches, acknowledges, reports
its lag, and closes. One module per broker (amqp, nats, redis, mqtt) makes one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pgmsg.inbox.bridges.mapping import Delivery


class Consumer(Protocol):
    """A connection to one broker's queue, stream or session, made lazily and kept while the
    bridge holds its lock. Every method raises BrokerUnavailable when the broker cannot be
    reached (the bridge then closes it and connects again after a backoff)."""

    #: Whether the bridge may fetch (and acknowledge) on a thread of its own while the worker
    #: stores (prefetch.py): only where the client may be used from two threads at once.
    fetch_ahead: bool

    def fetch(self, limit: int) -> list[Delivery]:
        """Up to ``limit`` messages, in the broker's order, without waiting for more than
        what is there (or a few milliseconds); none acknowledged yet. After close(), the
        first fetch starts again at the first unacknowledged message."""

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Acknowledge ``deliveries`` (what the last fetch returned), once stored."""

    def lag(self) -> int | None:
        """Messages waiting in the broker for this bridge, where the broker says (None
        otherwise)."""

    def close(self) -> None:
        """Drop the connection; unacknowledged messages go back to the broker."""
