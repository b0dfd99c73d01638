"""NATS JetStream into an inbox through nats-py: a durable pull consumer, acknowledged after
the commit, with bounded ack-pending.

URL: ``nats://user:pass@host:4222``; the bridge's topic is the subject (a filter, ``>`` and
``*`` allowed). pgmsg's options: ``stream`` (default: the stream that takes the subject),
``durable`` (the consumer's name; default ``pgmsg-<bridge>``, dots made dashes),
``max_ack_pending`` (default 1000), ``ack_wait`` (seconds; default 30), ``timeout`` (seconds;
default 10).

One process holds a bridge at a time (its lock), so the durable consumer has one puller.
JetStream would deliver new messages while the ones a dead holder had not acknowledged wait
out ``ack_wait``: out of order. So a new holder that finds messages pending acknowledgement
makes the consumer again from the first message after its acknowledged floor: what it stored
before is delivered again and skipped by the inbox as duplicates, in stream order. A message's
stream sequence is its position (``<stream>:<sequence>``); ``Nats-Msg-Id`` (set by a pgmsg
outbox too) is among its headers.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import nats
import nats.errors
import nats.js.api
import nats.js.errors

from pgmsg.core import broker_urls, errors
from pgmsg.inbox.bridges.declarations import Bridge
from pgmsg.inbox.bridges.mapping import Delivery

_DOWN = (TimeoutError, nats.errors.Error, OSError)


class NatsConsumer:
    fetch_ahead = False  # not tried: JetStream met its throughput target without it

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        servers, options = broker_urls.split_options(
            bridge.url,
            {
                "stream": "",
                "durable": f"pgmsg-{bridge.name}".replace(".", "-"),
                "max_ack_pending": "1000",
                "ack_wait": "30",
                "timeout": "10",
            },
        )
        check = {"url": bridge.url, "error": errors.UnknownBridge}
        self.servers = servers.rstrip("?")
        self.stream = options["stream"]
        self.durable = options["durable"]
        self.max_ack_pending = broker_urls.count(
            options["max_ack_pending"], option="max_ack_pending", **check
        )
        self.ack_wait = broker_urls.seconds(options["ack_wait"], option="ack_wait", **check)
        self.timeout = broker_urls.seconds(options["timeout"], option="timeout", **check)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._serve, name=f"pgmsg-bridge-{bridge.name}", daemon=True
        )
        self._thread.start()
        self._client = None
        self._js = None
        self._sub = None

    def _serve(self) -> None:
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def _run(self, coro):
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout=3 * self.timeout)
        except (*_DOWN, nats.js.errors.Error) as exc:
            self.close()
            raise errors.BrokerUnavailable(
                f"bridge {self.bridge.name} ({broker_urls.redact(self.bridge.url)}): "
                f"{broker_urls.short(exc)}"
            ) from exc

    async def _open(self) -> None:
        if self._sub is not None and self._client.is_connected:
            return
        client = nats.NATS()
        try:
            await asyncio.wait_for(
                client.connect(
                    self.servers,
                    allow_reconnect=False,  # the bridge reconnects, with its own backoff
                    connect_timeout=self.timeout,
                    max_reconnect_attempts=0,
                    name=f"pgmsg-bridge-{self.bridge.name}",
                ),
                self.timeout,
            )
        except BaseException:
            # A connection that failed half-way (the broker closed it) leaves its socket open.
            await asyncio.wait_for(client.close(), self.timeout)
            raise
        self._client = client
        self._js = self._client.jetstream(timeout=self.timeout)
        if not self.stream:
            self.stream = await self._js.find_stream_name_by_subject(self.bridge.topic)
        await self._take_consumer()
        self._sub = await self._js.pull_subscribe_bind(self.durable, self.stream)

    async def _take_consumer(self) -> None:
        config = nats.js.api.ConsumerConfig(
            durable_name=self.durable,
            ack_policy=nats.js.api.AckPolicy.EXPLICIT,
            max_ack_pending=self.max_ack_pending,
            ack_wait=self.ack_wait,
            filter_subject=self.bridge.topic,
        )
        try:
            info = await self._js.consumer_info(self.stream, self.durable)
        except nats.js.errors.NotFoundError:
            await self._js.add_consumer(self.stream, config)
            return
        if info.num_ack_pending or info.num_redelivered:
            # A dead holder's messages: start again after the acknowledged floor, in order.
            await self._js.delete_consumer(self.stream, self.durable)
            config.deliver_policy = nats.js.api.DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = info.ack_floor.stream_seq + 1
            await self._js.add_consumer(self.stream, config)

    async def _fetch(self, limit: int, wait: float) -> list:
        await self._open()
        try:
            return await self._sub.fetch(batch=limit, timeout=wait)
        except (TimeoutError, nats.errors.TimeoutError):  # nothing came in time
            return []

    def fetch(self, limit: int) -> list[Delivery]:
        found = self._run(self._fetch(limit, max(self.bridge.poll, 0.05)))
        return [
            Delivery(
                body=msg.data,
                headers=dict(msg.headers or {}),
                properties={"subject": msg.subject},
                position=f"{self.stream}:{msg.metadata.sequence.stream}",
                token=msg,
            )
            for msg in found
        ]

    async def _ack(self, deliveries: Sequence[Delivery]) -> None:
        for delivery in deliveries:
            await delivery.token.ack()
        await self._client.flush(timeout=self.timeout)

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        self._run(self._ack(deliveries))

    async def _lag(self) -> int:
        await self._open()
        info = await self._js.consumer_info(self.stream, self.durable)
        return info.num_pending + info.num_ack_pending

    def lag(self) -> int | None:
        return self._run(self._lag())

    async def _close(self) -> None:
        client, self._client, self._js, self._sub = self._client, None, None, None
        if client is not None and not client.is_closed:
            try:
                await asyncio.wait_for(client.close(), self.timeout)
            except Exception:  # closing is best effort: the socket is dropped either way
                pass

    def close(self) -> None:
        if self._client is not None and self._loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._close(), self._loop)
            try:
                future.result(timeout=self.timeout + 1)
            except Exception:  # best effort, as above
                pass
        try:
            self._loop.call_soon_threadsafe(self._loop.stop)
        except RuntimeError:  # closed already
            pass


def consumer(bridge: Bridge) -> NatsConsumer:
    return NatsConsumer(bridge)
