"""Redis Streams through redis-py: one ``XADD`` per message (pipelined), the message id in a
field. The reply (the entry's id) is the confirmation; how durable it is depends on the
server's persistence settings (appendonly, appendfsync).

URL: ``redis://user:pass@host:6379/0`` plus redis-py's options. pgmsg's options: ``maxlen``
(trim each stream to about this many entries; default: no trimming), ``timeout`` (seconds;
default PGMSG OUTBOX_PUBLISH_TIMEOUT). The topic is the stream's key. An entry's fields:
message_id, type, key (empty when none), payload (JSON text), headers (JSON object).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import redis
import redis.exceptions

from pgmsg.core import conf, errors
from pgmsg.outbox.destinations.base import Envelope, Outcome, redact, seconds, short, split_options


class RedisDestination:
    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        rest, options = split_options(url, {"maxlen": "", "timeout": ""})
        timeout = options["timeout"] or str(conf.get().OUTBOX_PUBLISH_TIMEOUT)
        self.timeout = seconds(timeout, option="timeout", url=url)
        self.maxlen = None
        if options["maxlen"]:
            if not options["maxlen"].isdigit() or int(options["maxlen"]) < 1:
                raise errors.UnknownDestination(
                    f"{redact(url)}: maxlen must be a positive int, got {options['maxlen']!r}"
                )
            self.maxlen = int(options["maxlen"])
        try:
            self.client = redis.Redis.from_url(
                rest, socket_timeout=self.timeout, socket_connect_timeout=self.timeout
            )
        except ValueError as exc:
            raise errors.UnknownDestination(f"destination {name!r}: {redact(url)}: {exc}")

    def publish(self, envelopes: Sequence[Envelope]) -> list[Outcome]:
        pipe = self.client.pipeline(transaction=False)
        for e in envelopes:
            pipe.xadd(
                e.topic,
                {
                    "message_id": e.message_id,
                    "type": e.type,
                    "key": e.key or "",
                    "payload": e.payload,
                    "headers": json.dumps(e.broker_headers()),
                },
                maxlen=self.maxlen,
                approximate=True,
            )
        try:
            results = pipe.execute(raise_on_error=False)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            self.close()
            raise errors.BrokerUnavailable(f"{self.name} ({redact(self.url)}): {short(exc)}")
        outcomes: list[Outcome] = []
        for result in results:
            if isinstance(result, redis.exceptions.ResponseError):
                outcomes.append(errors.MessageRefused(f"{self.name}: {short(result)}"))
            elif isinstance(result, Exception):
                outcomes.append(errors.BrokerUnavailable(f"{self.name}: {short(result)}"))
            else:
                outcomes.append(None)
        return outcomes

    def close(self) -> None:
        self.client.connection_pool.disconnect()


def from_setting(name: str, url: str) -> RedisDestination:
    return RedisDestination(name, url)
