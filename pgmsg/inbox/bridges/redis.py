"""Redis Streams into an inbox: a consumer group, XACK after the commit, and the pending
entries of a consumer that died claimed again with XAUTOCLAIM.

URL: ``redis://user:pass@host:6379/0`` plus redis-py's options; the bridge's topic is the
stream's key. pgmsg's options: ``group`` (the consumer group; default ``pgmsg-<bridge>``,
created at the stream's start if missing), ``body`` (the entry's field that holds the JSON
body; default ``payload``, what a pgmsg outbox writes), ``timeout`` (seconds; default 10).

One process holds a bridge at a time (its lock), so the group has one live consumer. When it
takes over, it claims the entries every other consumer of the group left pending (XAUTOCLAIM:
those consumers are dead, since the lock was free) and reads the pending entries again, in
stream order, before any new one. An entry's fields other than the body and ``headers`` are its
properties (a pgmsg outbox's ``message_id``, ``type``, ``key``); ``headers``, a JSON object, its
headers.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence

import redis
import redis.exceptions

from pgmsg.core import broker_urls, errors
from pgmsg.inbox.bridges.declarations import Bridge
from pgmsg.inbox.bridges.mapping import Delivery

_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


class RedisConsumer:
    #: redis-py's client may be used from two threads (each command takes a connection of the
    #: pool): the bridge fetches the next batch while it stores this one (prefetch.py).
    fetch_ahead = True

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        rest, options = broker_urls.split_options(
            bridge.url, {"group": f"pgmsg-{bridge.name}", "body": "payload", "timeout": "10"}
        )
        self.group = options["group"]
        self.body_field = options["body"].encode()
        timeout = broker_urls.seconds(
            options["timeout"], option="timeout", url=bridge.url, error=errors.UnknownBridge
        )
        self.stream = bridge.topic
        self.name = f"{socket.gethostname()}-{os.getpid()}"
        try:
            self.client = redis.Redis.from_url(
                rest, socket_timeout=timeout, socket_connect_timeout=timeout
            )
        except ValueError as exc:
            raise errors.UnknownBridge(f"bridge {bridge.name!r}: {exc}") from exc
        self._ready = False
        #: Read this consumer's pending entries (from "0", then after the last one read)
        #: before new ones (">"). After the last one read, not from "0" each time: a batch
        #: fetched ahead comes before the one in hand is acknowledged.
        self._pending_after: str | None = "0"

    def _call(self, method, *args, **kwargs):
        try:
            return method(*args, **kwargs)
        except _DOWN as exc:
            raise errors.BrokerUnavailable(
                f"bridge {self.bridge.name} ({broker_urls.redact(self.bridge.url)}): "
                f"{broker_urls.short(exc)}"
            ) from exc

    def _prepare(self) -> None:
        try:
            self._call(self.client.xgroup_create, self.stream, self.group, id="0", mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise errors.BrokerUnavailable(f"bridge {self.bridge.name}: {exc}") from exc
        self._claim_from_the_dead()
        self._ready = True

    def _claim_from_the_dead(self) -> None:
        start = "0-0"
        while True:
            start, *_ = self._call(
                self.client.xautoclaim,
                self.stream,
                self.group,
                self.name,
                min_idle_time=0,  # the lock was free: every other consumer is gone
                start_id=start,
                count=1000,
            )
            if start in (b"0-0", "0-0"):
                break
        for consumer in self._call(self.client.xinfo_consumers, self.stream, self.group):
            name = consumer["name"]
            name = name.decode() if isinstance(name, bytes) else name
            if name != self.name and not consumer["pending"]:
                self._call(self.client.xgroup_delconsumer, self.stream, self.group, name)

    def fetch(self, limit: int) -> list[Delivery]:
        if not self._ready:
            self._prepare()
        pending = self._pending_after is not None
        start = self._pending_after if pending else ">"
        # New entries: wait up to one poll for them (BLOCK), so a message is taken as it comes.
        block = None if pending else max(int(self.bridge.poll * 1000), 1)
        found = self._call(
            self.client.xreadgroup,
            self.group,
            self.name,
            {self.stream: start},
            count=limit,
            block=block,
        )
        entries = found[0][1] if found else []
        if pending:
            if not entries:
                self._pending_after = None
                return self.fetch(limit)
            self._pending_after = entries[-1][0].decode()
        return [self._delivery(entry_id, fields) for entry_id, fields in entries]

    def _delivery(self, entry_id: bytes, fields: dict | None) -> Delivery:
        fields = fields or {}  # an entry trimmed from the stream while pending has none
        properties, headers = {}, {}
        for key, value in fields.items():
            if key == b"headers":
                try:
                    decoded = json.loads(value)
                except ValueError:
                    decoded = None
                if isinstance(decoded, dict):
                    headers = {str(k): str(v) for k, v in decoded.items()}
            elif key != self.body_field:
                properties[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        return Delivery(
            body=fields.get(self.body_field),
            headers=headers,
            properties=properties,
            position=entry_id.decode(),
            token=entry_id,
        )

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        self._call(self.client.xack, self.stream, self.group, *[d.token for d in deliveries])

    def lag(self) -> int | None:
        for group in self._call(self.client.xinfo_groups, self.stream):
            name = group["name"]
            if (name.decode() if isinstance(name, bytes) else name) == self.group:
                lag = group.get("lag")
                return None if lag is None else int(lag) + int(group.get("pending", 0))
        return None

    def close(self) -> None:
        self.client.connection_pool.disconnect()


def consumer(bridge: Bridge) -> RedisConsumer:
    return RedisConsumer(bridge)
