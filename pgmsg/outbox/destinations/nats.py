"""NATS JetStream through nats-py: each message carries ``Nats-Msg-Id`` (the stream drops a
re-publish within its duplicate window) and counts as sent once the stream's ack arrived.

URL: ``nats://user:pass@host:4222`` (several servers: comma-separated in one URL's host
part is not supported; name one). pgmsg's options: ``timeout`` (seconds to wait for an ack;
default PGMSG OUTBOX_PUBLISH_TIMEOUT), and ``declare=1`` with ``stream=NAME`` (and
``subjects=a.>,b``, default ``NAME.>``): the relay creates that stream when it connects, if
no stream of that name exists. The topic is the subject; a stream must take it.

nats-py is asyncio-only: the destination runs its own event loop in a daemon thread of the
relay process, and the relay waits on it with a timeout.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import nats
import nats.errors
import nats.js.errors

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

# Answers about one message (the stream said no, or the client refused it before sending).
# NoRespondersError: no stream takes the subject.
_REFUSED = (
    nats.js.errors.APIError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.errors.MaxPayloadError,
    nats.errors.BadSubjectError,
    nats.errors.BadHeaderError,
)


class NatsDestination:
    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        self.servers, options = split_options(
            url, {"timeout": "", "declare": "0", "stream": "", "subjects": ""}
        )
        self.servers = self.servers.rstrip("?")
        self.declare = flag(options["declare"], option="declare", url=url)
        self.stream = options["stream"]
        if self.declare and not self.stream:
            raise errors.UnknownDestination(
                f"destination {name!r}: {redact(url)}: declare=1 needs stream=NAME"
            )
        self.subjects = [s for s in options["subjects"].split(",") if s] or [f"{self.stream}.>"]
        timeout = options["timeout"] or str(conf.get().OUTBOX_PUBLISH_TIMEOUT)
        self.timeout = seconds(timeout, option="timeout", url=url)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client = None
        self._js = None

    def publish(self, envelopes: Sequence[Envelope]) -> list[Outcome]:
        loop = self._ensure_loop()
        future = asyncio.run_coroutine_threadsafe(self._publish(envelopes), loop)
        try:
            return future.result(timeout=3 * self.timeout)
        except TimeoutError as exc:  # the loop itself is stuck: start afresh next time
            future.cancel()
            self.close()
            raise errors.BrokerUnavailable(f"{self.name}: no answer in time") from exc

    async def _publish(self, envelopes: Sequence[Envelope]) -> list[Outcome]:
        if self._client is None or not self._client.is_connected:
            await self._close()
            try:
                self._client = await asyncio.wait_for(
                    nats.connect(
                        self.servers,
                        allow_reconnect=False,  # the relay reconnects, with its own backoff
                        connect_timeout=self.timeout,
                        max_reconnect_attempts=0,
                        name=f"pgmsg-relay-{self.name}",
                    ),
                    self.timeout,
                )
            except (TimeoutError, nats.errors.Error, OSError) as exc:
                self._client = None
                raise errors.BrokerUnavailable(
                    f"{self.name} ({redact(self.url)}): {short(exc)}"
                ) from exc
            self._js = self._client.jetstream(timeout=self.timeout)
            if self.declare:
                try:
                    await self._declare_stream()
                except _REFUSED as exc:  # the server said no (a subject another stream takes)
                    await self._close()
                    refused = errors.MessageRefused(f"{self.name}: declaring: {short(exc)}")
                    return [refused] * len(envelopes)
                except (TimeoutError, nats.errors.Error) as exc:
                    await self._close()
                    raise errors.BrokerUnavailable(
                        f"{self.name} ({redact(self.url)}): {short(exc)}"
                    ) from exc
        results = await asyncio.gather(
            *(
                self._js.publish(
                    e.topic,
                    e.body,
                    timeout=self.timeout,
                    headers={**e.broker_headers(), "Nats-Msg-Id": e.message_id},
                )
                for e in envelopes
            ),
            return_exceptions=True,
        )
        outcomes: list[Outcome] = []
        for result in results:
            if not isinstance(result, BaseException):
                outcomes.append(None)
            elif isinstance(result, _REFUSED) and not isinstance(
                result, nats.js.errors.ServiceUnavailableError
            ):
                outcomes.append(errors.MessageRefused(f"{self.name}: {_describe(result)}"))
            else:  # a timeout, a lost connection: nothing is known about this message
                outcomes.append(
                    errors.BrokerUnavailable(f"{self.name} ({redact(self.url)}): {short(result)}")
                )
        if any(isinstance(o, errors.BrokerUnavailable) for o in outcomes):
            await self._close()
        return outcomes

    async def _declare_stream(self) -> None:
        try:
            await self._js.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            await self._js.add_stream(name=self.stream, subjects=self.subjects)

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(
                target=self._loop.run_forever, name=f"pgmsg-nats-{self.name}", daemon=True
            ).start()
        return self._loop

    async def _close(self) -> None:
        client, self._client, self._js = self._client, None, None
        if client is not None and not client.is_closed:
            try:
                await asyncio.wait_for(client.close(), self.timeout)
            except Exception:  # closing is best effort: the socket is dropped either way
                pass

    def close(self) -> None:
        if self._loop is not None and self._client is not None:
            future = asyncio.run_coroutine_threadsafe(self._close(), self._loop)
            try:
                future.result(timeout=self.timeout + 1)
            except Exception:  # best effort, as above
                pass


def _describe(exc: BaseException) -> str:
    if isinstance(exc, nats.errors.NoRespondersError | nats.js.errors.NoStreamResponseError):
        return "no JetStream stream takes this subject (no responders)"
    return short(exc)


def from_setting(name: str, url: str) -> NatsDestination:
    return NatsDestination(name, url)
