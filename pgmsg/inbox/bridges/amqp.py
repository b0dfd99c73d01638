"""RabbitMQ (AMQP 0-9-1) into an inbox through pika: manual acknowledgements after the
commit, a bounded prefetch.

URL: ``amqp://user:pass@host:5672/vhost`` plus pika's options; the bridge's topic is the
queue. pgmsg's options: ``prefetch`` (unacknowledged messages the broker may hand the bridge;
default 1000), ``declare`` (1: declare the queue, durable, with ``x-single-active-consumer``;
default 0: it must exist), ``timeout`` (seconds; default 10).

One process holds a bridge at a time (its lock); a queue declared with
``x-single-active-consumer`` lets RabbitMQ enforce the same. When the holder dies, RabbitMQ
puts its unacknowledged messages back at their place in the queue, and the next holder reads
them first. The message's ``message_id``, ``type``, ``correlation_id``, ``app_id`` and
``content_type`` are its properties, its headers table its headers.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence

import pika
import pika.exceptions

from pgmsg.core import broker_urls, errors
from pgmsg.inbox.bridges.declarations import Bridge
from pgmsg.inbox.bridges.mapping import Delivery

logger = logging.getLogger(__name__)
_DOWN = (pika.exceptions.AMQPError, OSError)
_PROPERTIES = ("message_id", "type", "correlation_id", "app_id", "content_type")


class AmqpConsumer:
    fetch_ahead = False  # pika's connection belongs to one thread

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        rest, options = broker_urls.split_options(
            bridge.url, {"prefetch": "1000", "declare": "0", "timeout": "10"}
        )
        check = {"url": bridge.url, "error": errors.UnknownBridge}
        self.prefetch = broker_urls.count(options["prefetch"], option="prefetch", **check)
        self.declare = broker_urls.flag(options["declare"], option="declare", **check)
        timeout = broker_urls.seconds(options["timeout"], option="timeout", **check)
        try:
            self.parameters = pika.URLParameters(rest)
        except Exception as exc:  # pika raises ValueError, TypeError or its own errors here
            raise errors.UnknownBridge(f"bridge {bridge.name!r}: {exc}") from exc
        self.parameters.connection_attempts = 1
        self.parameters.socket_timeout = timeout
        self.parameters.stack_timeout = timeout
        self.queue = bridge.topic
        self._connection: pika.BlockingConnection | None = None
        self._channel = None
        self._buffer: deque[Delivery] = deque()

    def _down(self, exc: BaseException) -> errors.BrokerUnavailable:
        self.close()
        return errors.BrokerUnavailable(
            f"bridge {self.bridge.name} ({broker_urls.redact(self.bridge.url)}): "
            f"{broker_urls.short(exc)}"
        )

    def _open(self):
        if self._channel is not None and self._channel.is_open:
            return self._channel
        self.close()
        self._connection = pika.BlockingConnection(self.parameters)
        channel = self._connection.channel()
        if self.declare:
            channel.queue_declare(
                self.queue, durable=True, arguments={"x-single-active-consumer": True}
            )
        channel.basic_qos(prefetch_count=self.prefetch)
        channel.basic_consume(self.queue, self._on_message, auto_ack=False)
        self._channel = channel
        return channel

    def _on_message(self, channel, method, properties, body) -> None:
        self._buffer.append(
            Delivery(
                body=body,
                headers={str(k): _text(v) for k, v in (properties.headers or {}).items()},
                properties={
                    name: _text(getattr(properties, name))
                    for name in _PROPERTIES
                    if getattr(properties, name) is not None
                },
                position="",
                token=method.delivery_tag,
            )
        )

    def fetch(self, limit: int) -> list[Delivery]:
        try:
            self._open()
            # Nothing in hand: wait a moment for the broker (one poll) rather than return.
            self._connection.process_data_events(time_limit=0 if self._buffer else self.bridge.poll)
        except _DOWN as exc:
            raise self._down(exc) from exc
        return [self._buffer.popleft() for _ in range(min(limit, len(self._buffer)))]

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        # Deliveries come in tag order on one channel: the last tag acknowledges them all.
        try:
            self._channel.basic_ack(delivery_tag=deliveries[-1].token, multiple=True)
        except (*_DOWN, AttributeError) as exc:
            raise self._down(exc) from exc

    def lag(self) -> int | None:
        try:
            found = self._open().queue_declare(self.queue, passive=True)
        except _DOWN as exc:
            raise self._down(exc) from exc
        return found.method.message_count

    def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        self._buffer.clear()  # unacknowledged: RabbitMQ delivers them again
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except _DOWN:
                pass


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def consumer(bridge: Bridge) -> AmqpConsumer:
    return AmqpConsumer(bridge)
