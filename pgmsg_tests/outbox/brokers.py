"""The brokers on this machine, seen from a test: make a place to publish to, read back what
arrived there, and clean up. Each test gets names of its own (the brokers are shared)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid

from pgmsg_tests.conftest import skip_unless

PORTS = {"amqp": 5672, "nats": 4222, "redis": 6379, "mqtt": 1883}
NAMES = {"amqp": "RabbitMQ", "nats": "NATS", "redis": "Redis", "mqtt": "Mosquitto (MQTT)"}


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def require(*kinds: str) -> None:
    """Skip the test, saying which brokers are missing, where they do not listen; under CI
    (PGMSG_NO_SKIP=1, set by .ci/run) fail instead: CI must exercise every broker."""
    missing = [f"{NAMES[k]} on 127.0.0.1:{PORTS[k]}" for k in kinds if not listening(PORTS[k])]
    skip_unless(not missing, f"not listening: {', '.join(missing)}")


class Received(dict):
    """One message read back: message_id, key, payload (decoded), headers.

    Each client's ``consume(topic, count)`` returns every message that reached ``topic`` so
    far, in arrival order, once there are ``count`` of them (or at its timeout).
    """


class Amqp:
    kind = "amqp"

    def __init__(self) -> None:
        import pika

        self.pika = pika
        self.connection = pika.BlockingConnection(
            pika.URLParameters("amqp://guest:guest@127.0.0.1:5672/%2F")
        )
        self.channel = self.connection.channel()
        self.queues: list[str] = []
        self.received: dict[str, list[Received]] = {}
        self.name = f"pgmsg-test-{uuid.uuid4().hex[:12]}"

    def topic(self) -> str:
        self._declare(self.name)
        return self.name

    def refused_topic(self) -> str:
        return self.name + "-unbound"  # no such queue: the default exchange returns it

    def fix(self, topic: str) -> None:
        self._declare(topic)

    def _declare(self, queue: str) -> None:
        self.channel.queue_declare(queue)
        self.queues.append(queue)

    def consume(self, topic: str, count: int, timeout: float = 60) -> list[Received]:
        """Every message taken from the queue so far (taking is destructive: they are kept
        here), once there are ``count`` (or at the timeout)."""
        found = self.received.setdefault(topic, [])
        deadline = time.monotonic() + timeout
        while len(found) < count and time.monotonic() < deadline:
            method, properties, body = self.channel.basic_get(topic, auto_ack=True)
            if method is None:
                time.sleep(0.05)
                continue
            headers = dict(properties.headers or {})
            assert properties.message_id == headers["pgmsg-message-id"]
            assert properties.delivery_mode == 2
            found.append(
                Received(
                    message_id=properties.message_id,
                    key=headers.get("pgmsg-key"),
                    payload=json.loads(body),
                    headers=headers,
                )
            )
        return found

    def close(self) -> None:
        for queue in self.queues:
            self.channel.queue_delete(queue)
        self.connection.close()


class Nats:
    kind = "nats"

    def __init__(self) -> None:
        import nats

        self.nats = nats
        self.loop = asyncio.new_event_loop()
        self.client = self._run(nats.connect("nats://127.0.0.1:4222"))
        self.js = self.client.jetstream()
        self.hex = uuid.uuid4().hex[:12]
        self.streams: list[str] = []

    def _run(self, coro):
        return self.loop.run_until_complete(coro)

    def topic(self) -> str:
        self._stream(f"PGMSGTEST_{self.hex}", f"pgmsgtest.{self.hex}.>")
        return f"pgmsgtest.{self.hex}.orders"

    def refused_topic(self) -> str:
        return f"pgmsgtest.{self.hex}x.orders"  # no stream takes it

    def fix(self, topic: str) -> None:
        self._stream(f"PGMSGTEST_{self.hex}X", topic)

    def _stream(self, name: str, subject: str) -> None:
        self._run(self.js.add_stream(name=name, subjects=[subject]))
        self.streams.append(name)

    def stream_of(self, topic: str) -> str:
        return self.streams[0] if topic.startswith(f"pgmsgtest.{self.hex}.") else self.streams[-1]

    def consume(self, topic: str, count: int, timeout: float = 60) -> list[Received]:
        """Every message the stream holds for ``topic`` once it holds ``count`` (or at the
        timeout): what the stream stored, duplicates included."""
        stream = self.stream_of(topic)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self._run(self.js.stream_info(stream))
            if info.state.messages >= count:
                break
            time.sleep(0.05)
        info = self._run(self.js.stream_info(stream))
        found = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = self._run(self.js.get_msg(stream, seq))
            headers = dict(msg.headers or {})
            assert headers["Nats-Msg-Id"] == headers["pgmsg-message-id"]
            found.append(
                Received(
                    message_id=headers["Nats-Msg-Id"],
                    key=headers.get("pgmsg-key"),
                    payload=json.loads(msg.data),
                    headers=headers,
                )
            )
        return found

    def close(self) -> None:
        for name in self.streams:
            self._run(self.js.delete_stream(name))
        self._run(self.client.close())
        self.loop.close()


class Redis:
    kind = "redis"

    def __init__(self) -> None:
        import redis

        self.client = redis.Redis.from_url("redis://127.0.0.1:6379/0", decode_responses=True)
        self.hex = uuid.uuid4().hex[:12]
        self.keys: list[str] = []

    def topic(self) -> str:
        self.keys.append(f"pgmsg-test:{self.hex}")
        return self.keys[-1]

    def refused_topic(self) -> str:
        key = f"pgmsg-test:{self.hex}:string"
        self.client.set(key, "not a stream")  # XADD answers WRONGTYPE
        self.keys.append(key)
        return key

    def fix(self, topic: str) -> None:
        self.client.delete(topic)

    def consume(self, topic: str, count: int, timeout: float = 60) -> list[Received]:
        deadline = time.monotonic() + timeout
        while self.client.xlen(topic) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return [
            Received(
                message_id=fields["message_id"],
                key=fields["key"] or None,
                payload=json.loads(fields["payload"]),
                headers=json.loads(fields["headers"]),
            )
            for _, fields in self.client.xrange(topic)
        ]

    def close(self) -> None:
        if self.keys:
            self.client.delete(*self.keys)
        self.client.close()


class Mqtt:
    kind = "mqtt"

    def __init__(self) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.hex = uuid.uuid4().hex[:12]
        self.messages: list[Received] = []
        self._lock = threading.Lock()
        subscribed = threading.Event()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"pgmsg-test-{self.hex}", protocol=mqtt.MQTTv5
        )
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *args: subscribed.set()
        self.client.connect("127.0.0.1", 1883)
        self.client.loop_start()
        self.client.subscribe(f"pgmsg-test/{self.hex}/#", qos=1)
        assert subscribed.wait(10), "MQTT subscription not acknowledged"

    def _on_message(self, client, userdata, message) -> None:
        headers = dict(getattr(message.properties, "UserProperty", []) or [])
        with self._lock:
            self.messages.append(
                Received(
                    message_id=headers["pgmsg-message-id"],
                    key=headers.get("pgmsg-key"),
                    payload=json.loads(message.payload),
                    headers=headers,
                    topic=message.topic,
                )
            )

    def topic(self) -> str:
        return f"pgmsg-test/{self.hex}/orders"

    def refused_topic(self) -> str:
        return f"pgmsg-test/{self.hex}/+"  # a wildcard: no message can be published to it

    fix = None  # nothing makes a wildcard topic publishable

    def consume(self, topic: str, count: int, timeout: float = 60) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                found = [m for m in self.messages if m["topic"] == topic]
            if len(found) >= count:
                break
            time.sleep(0.05)
        return found

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


CLIENTS = {"amqp": Amqp, "nats": Nats, "redis": Redis, "mqtt": Mqtt}


def connect(kind: str):
    require(kind)
    return CLIENTS[kind]()
