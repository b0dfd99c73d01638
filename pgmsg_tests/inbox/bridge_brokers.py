"""The brokers as the bridge tests see them: a queue, stream, subject or topic of one test's
own, a raw sender (a producer that is not pgmsg), and the bridge declaration that reads it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

from pgmsg_tests.outbox import brokers

URLS = {
    "amqp": "amqp://guest:guest@127.0.0.1:{port}/%2F",
    "nats": "nats://127.0.0.1:{port}",
    "redis": "redis://127.0.0.1:{port}/0",
    "mqtt": "mqtt://127.0.0.1:{port}",
}
#: The outbox destination names of pgmsg_tests.settings, per broker.
DESTINATIONS = {"amqp": "rabbit", "nats": "jetstream", "redis": "redis", "mqtt": "mqtt"}


def url(kind: str, port: int | None = None, **options: str) -> str:
    found = URLS[kind].format(port=port or brokers.PORTS[kind])
    if options:
        found += "?" + "&".join(f"{k}={v}" for k, v in options.items())
    return found


class Place:
    """A place of one test's own on one broker: ``topic`` (what the outbox publishes to and
    the bridge consumes), ``options`` (the bridge URL's), send() a raw message, close()."""

    def __init__(self, kind: str) -> None:
        brokers.require(kind)
        self.kind = kind
        self.tag = f"bridges-{uuid.uuid4().hex[:10]}"
        self.options: dict[str, str] = {}
        getattr(self, f"_open_{kind}")()

    def bridge(self, inbox: str, port: int | None = None, **extra) -> dict:
        return {
            "url": url(self.kind, port, **self.options),
            "topic": self.topic,
            "inbox": inbox,
            **extra,
        }

    # -- Redis Streams -------------------------------------------------------------------------

    def _open_redis(self) -> None:
        import redis

        self.client = redis.Redis.from_url(url("redis"))
        self.topic = self.tag

    def _send_redis(self, body: bytes, headers: dict, properties: dict) -> None:
        fields = {**properties, "payload": body}
        if headers:
            fields["headers"] = json.dumps(headers)
        self.client.xadd(self.topic, fields)

    def _unacknowledged_redis(self) -> int:
        (group,) = [g for g in self.client.xinfo_groups(self.topic) if g["name"] == b"pgmsg-b"]
        return int(group["pending"]) + int(group["lag"] or 0)

    def _close_redis(self) -> None:
        self.client.delete(self.topic)
        self.client.close()

    # -- RabbitMQ ------------------------------------------------------------------------------

    def _open_amqp(self) -> None:
        import pika

        self.pika = pika
        self.connection = pika.BlockingConnection(pika.URLParameters(url("amqp")))
        self.channel = self.connection.channel()
        self.topic = self.tag
        self.channel.queue_declare(
            self.topic, durable=True, arguments={"x-single-active-consumer": True}
        )

    def _send_amqp(self, body: bytes, headers: dict, properties: dict) -> None:
        self.channel.basic_publish(
            "",
            self.topic,
            body,
            self.pika.BasicProperties(headers=headers or None, delivery_mode=2, **properties),
        )

    def _fresh_amqp(self):
        """The channel, on a new connection: a process test leaves the first one idle past its
        heartbeat, and pika learns that the broker closed it only when it next uses it."""
        try:
            self.connection.close()
        except Exception:  # closed by the broker already
            pass
        self.connection = self.pika.BlockingConnection(self.pika.URLParameters(url("amqp")))
        self.channel = self.connection.channel()
        return self.channel

    def _unacknowledged_amqp(self) -> int:
        found = self._fresh_amqp().queue_declare(self.topic, passive=True)
        return found.method.message_count

    def _close_amqp(self) -> None:
        self._fresh_amqp().queue_delete(self.topic)
        self.connection.close()

    # -- NATS JetStream ------------------------------------------------------------------------

    def _open_nats(self) -> None:
        import nats

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        self.nc = self._run(nats.connect(url("nats")))
        self.js = self.nc.jetstream()
        self.stream = self.tag.replace("-", "_")
        self.topic = f"{self.stream}.ticks"
        self._run(self.js.add_stream(name=self.stream, subjects=[f"{self.stream}.>"]))

    def _serve(self) -> None:
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def _send_nats(self, body: bytes, headers: dict, properties: dict) -> None:
        self._run(self.js.publish(self.topic, body, headers=headers or None))

    def _unacknowledged_nats(self) -> int:
        info = self._run(self.js.consumer_info(self.stream, "pgmsg-b"))
        return info.num_pending + info.num_ack_pending

    def _close_nats(self) -> None:
        try:
            self._run(self.js.delete_stream(self.stream))
        finally:
            self._run(self.nc.close())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    # -- MQTT ----------------------------------------------------------------------------------

    def _open_mqtt(self) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.mqtt = mqtt
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"{self.tag}-sender", protocol=mqtt.MQTTv5
        )
        self.client.connect("127.0.0.1", brokers.PORTS["mqtt"])
        self.client.loop_start()
        self.topic = f"pgmsg-tests/{self.tag}"
        # A session of this test's own, gone 5 minutes after its last bridge disconnected.
        self.options = {"client_id": self.tag, "session_expiry": "300"}

    def _send_mqtt(self, body: bytes, headers: dict, properties: dict) -> None:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = Properties(PacketTypes.PUBLISH)
        if headers:
            props.UserProperty = list(headers.items())
        self.client.publish(self.topic, body, qos=1, properties=props).wait_for_publish(10)

    def _unacknowledged_mqtt(self) -> int:
        return 0  # MQTT has no way to ask a broker what a session holds

    def _close_mqtt(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    # -- every broker --------------------------------------------------------------------------

    def send(self, body: bytes, headers: dict | None = None, **properties: str) -> None:
        getattr(self, f"_send_{self.kind}")(body, headers or {}, properties)

    def unacknowledged(self) -> int:
        """Messages the broker still holds for bridge "b" (0 once it stored and acked all)."""
        return getattr(self, f"_unacknowledged_{self.kind}")()

    def close(self) -> None:
        getattr(self, f"_close_{self.kind}")()


def settle(seconds: float = 0.2) -> None:
    """Let a broker route what was just sent (MQTT and JetStream deliver asynchronously)."""
    time.sleep(seconds)
