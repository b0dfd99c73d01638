"""RabbitMQ (AMQP 0-9-1) through pika: publisher confirms, persistent messages, message_id.

URL: ``amqp://user:pass@host:5672/vhost?exchange=orders`` plus pika's own options
(``heartbeat``, ``socket_timeout``, ...). pgmsg's options: ``exchange`` (default: the default
exchange, which routes to the queue named by the topic), ``mandatory`` (1, the default: a
message no queue takes is refused, not dropped), ``timeout`` (seconds; default PGMSG
OUTBOX_PUBLISH_TIMEOUT), ``declare`` (0, the default: the exchange, or with the default
exchange each topic's queue, must exist; 1: the relay declares it, durable, when it opens its
channel) and ``exchange_type`` (what ``declare`` makes; default ``topic``). The topic is the
routing key.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pika
import pika.exceptions

from pgmsg.core import conf, errors
from pgmsg.outbox.destinations.base import (
    Envelope,
    Outcome,
    flag,
    redact,
    seconds,
    short,
    split_options,
)

# Refusals: the broker answered about this message. Anything else (a lost or refused
# connection, a timeout) says nothing about it: the broker counts as unavailable.
_REFUSED = (
    pika.exceptions.UnroutableError,
    pika.exceptions.NackError,
    pika.exceptions.ChannelClosedByBroker,
)


class _BrokerClosedChannel(logging.Filter):
    """pika logs a WARNING, full of object reprs, each time the broker closes a channel (a
    missing exchange: every try). pgmsg reports that refusal itself (one line per streak,
    and the message's last error), so this one record is dropped; pika's others stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Received remote Channel.Close")


logging.getLogger("pika.channel").addFilter(_BrokerClosedChannel())


class AmqpDestination:
    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        rest, options = split_options(
            url,
            {"exchange": "", "mandatory": "1", "timeout": "", "declare": "0", "exchange_type": ""},
        )
        self.exchange = options["exchange"]
        self.mandatory = flag(options["mandatory"], option="mandatory", url=url)
        self.declare = flag(options["declare"], option="declare", url=url)
        self.exchange_type = options["exchange_type"] or "topic"
        self._declared_queues: set[str] = set()
        timeout = options["timeout"] or str(conf.get().OUTBOX_PUBLISH_TIMEOUT)
        self.timeout = seconds(timeout, option="timeout", url=url)
        try:
            self.parameters = pika.URLParameters(rest)
        except Exception as exc:  # pika raises ValueError, TypeError or its own errors here
            raise errors.UnknownDestination(f"destination {name!r}: {redact(url)}: {exc}")
        self.parameters.connection_attempts = 1
        self.parameters.socket_timeout = self.timeout
        self.parameters.stack_timeout = self.timeout
        if self.parameters.blocked_connection_timeout is None:
            # A broker that blocks publishers (memory or disk alarm) counts as unavailable.
            self.parameters.blocked_connection_timeout = self.timeout
        self._connection: pika.BlockingConnection | None = None
        self._channel = None

    def publish(self, envelopes: Sequence[Envelope]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        retried = False
        for envelope in envelopes:
            while True:
                try:
                    channel = self._open_channel()
                    if self.declare and not self.exchange:
                        self._declare_queue(channel, envelope.topic)
                    channel.basic_publish(
                        exchange=self.exchange,
                        routing_key=envelope.topic,
                        body=envelope.body,
                        properties=pika.BasicProperties(
                            message_id=envelope.message_id,
                            type=envelope.type,
                            content_type="application/json",
                            delivery_mode=pika.DeliveryMode.Persistent,
                            headers=envelope.broker_headers(),
                        ),
                        mandatory=self.mandatory,
                    )
                except _REFUSED as exc:
                    if isinstance(exc, pika.exceptions.ChannelClosedByBroker):
                        self._channel = None  # the broker closed it; the next message opens one
                    outcomes.append(errors.MessageRefused(f"{self.name}: {_describe(exc)}"))
                except (pika.exceptions.AMQPError, OSError) as exc:
                    self.close()
                    if not retried and not outcomes:
                        # A connection that idled past its heartbeat is found dead here: one
                        # fresh try before the broker counts as down.
                        retried = True
                        continue
                    unavailable = errors.BrokerUnavailable(
                        f"{self.name} ({redact(self.url)}): {short(exc)}"
                    )
                    return outcomes + [unavailable] * (len(envelopes) - len(outcomes))
                else:
                    outcomes.append(None)
                break
        return outcomes

    def _open_channel(self):
        if self._connection is None or not self._connection.is_open:
            self._connection = pika.BlockingConnection(self.parameters)
            self._channel = None
        if self._channel is None or not self._channel.is_open:
            self._channel = self._connection.channel()
            self._channel.confirm_delivery()
            if self.declare and self.exchange:
                self._channel.exchange_declare(
                    exchange=self.exchange, exchange_type=self.exchange_type, durable=True
                )
        return self._channel

    def _declare_queue(self, channel, queue: str) -> None:
        """declare=1 with the default exchange: the queue the topic names, once per relay."""
        if queue not in self._declared_queues:
            channel.queue_declare(queue=queue, durable=True)
            self._declared_queues.add(queue)

    def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except (pika.exceptions.AMQPError, OSError):
                pass


def _describe(exc: Exception) -> str:
    if isinstance(exc, pika.exceptions.UnroutableError):
        return "unroutable: no queue is bound for this routing key (the broker returned it)"
    if isinstance(exc, pika.exceptions.NackError):
        return "the broker nacked the message"
    return short(exc)


def from_setting(name: str, url: str) -> AmqpDestination:
    return AmqpDestination(name, url)
