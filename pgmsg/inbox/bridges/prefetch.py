"""Fetch and map the next batch while the current one is stored, for a consumer whose client
may be used from two threads at once (``Consumer.fetch_ahead``; Redis Streams).

Storing a batch waits on PostgreSQL and fetching one waits on the broker: done one after the
other, a bridge with a backlog spends the sum of both. Here a thread fetches and maps batch
k+1 while the worker's thread stores batch k, then acknowledges batch k once it is stored.
Only a full batch starts the next fetch: a bridge that has caught up fetches when it polls,
as without a prefetch, so a message that arrives is not left in hand until the next poll.

What a prefetch took is not acknowledged: if it is dropped (close), the broker delivers it
again, as it does every unacknowledged message after close.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any

from pgmsg.inbox.bridges.consumer import Consumer
from pgmsg.inbox.bridges.mapping import Delivery

#: A fetched batch: each delivery with what it maps to.
Batch = list[tuple[Delivery, Any]]


class Batches:
    """A consumer's batches, each delivery mapped; fetched ahead when the consumer allows it
    (``fetch_ahead``), one after the other otherwise."""

    def __init__(self, consumer: Consumer, convert: Callable[[Delivery], Any], name: str) -> None:
        self._consumer = consumer
        self._convert = convert
        self._thread = None
        if consumer.fetch_ahead is True:
            self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)
        self._next: concurrent.futures.Future[Batch] | None = None
        self._acked: concurrent.futures.Future[None] | None = None

    def _fetch(self, limit: int) -> Batch:
        return [(d, self._convert(d)) for d in self._consumer.fetch(limit)]

    def take(self, limit: int) -> Batch:
        """The next batch (the one fetched ahead, or fetched now); a full one starts the
        fetch of the batch after it. Raises what the fetch raised (BrokerUnavailable)."""
        ahead, self._next = self._next, None
        batch = ahead.result() if ahead is not None else self._fetch(limit)
        acked, self._acked = self._acked, None
        if acked is not None:
            acked.result()  # a failed acknowledgement: the broker is down (BrokerUnavailable)
        if self._thread is not None and len(batch) >= limit:
            self._next = self._thread.submit(self._fetch, limit)
        return batch

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Acknowledge a stored batch: at once, or, while the next batch is being fetched, on
        the fetching thread right after it (a failure is raised by the next take())."""
        if self._next is None:
            self._consumer.ack(deliveries)
        else:
            self._acked = self._thread.submit(self._consumer.ack, deliveries)

    def close(self) -> None:
        """Close the consumer, which breaks off a fetch in progress, then wait for that fetch
        to end: a consumer opened after this one must not read while it still reads. An
        acknowledgement not yet sent is not sent: the broker delivers that batch again, and the
        inbox skips it as a duplicate."""
        try:
            self._consumer.close()
        finally:
            if self._thread is not None:
                self._thread.shutdown(wait=True, cancel_futures=True)
            self._next = self._acked = None
