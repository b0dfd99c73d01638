"""MQTT into an inbox through paho-mqtt: QoS 1 in a persistent session, each message
acknowledged (PUBACK) after the commit.

URL: ``mqtt://user:pass@host:1883`` (``mqtts://`` for TLS with the system's CAs); the bridge's
topic is the topic filter it subscribes to. pgmsg's options: ``client_id`` (the session's;
default ``pgmsg-bridge-<bridge>``), ``session_expiry`` (seconds the broker keeps the session
while no bridge is connected; default 86400), ``receive_maximum`` (unacknowledged messages the
broker may send at once; default 1000), ``keepalive`` (default 30), ``timeout`` (default 10).
MQTT 5 is spoken: the headers are the user properties (a pgmsg outbox's among them).

One process holds a bridge at a time (its lock), and so the session: when the holder dies,
the next one connects to the same session, and the broker sends it the messages that were
not acknowledged, then those it queued meanwhile. A broker keeps a bounded queue for a session
that is not connected (Mosquitto's max_queued_messages, 1000 by default): beyond it, it drops.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from urllib.parse import unquote, urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from pgmsg.core import broker_urls, errors
from pgmsg.inbox.bridges.declarations import Bridge
from pgmsg.inbox.bridges.mapping import Delivery


class MqttConsumer:
    fetch_ahead = False  # paho's network thread already receives ahead of fetch()

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        _, options = broker_urls.split_options(
            bridge.url,
            {
                "client_id": f"pgmsg-bridge-{bridge.name}",
                "session_expiry": "86400",
                "receive_maximum": "1000",
                "keepalive": "30",
                "timeout": "10",
            },
        )
        check = {"url": bridge.url, "error": errors.UnknownBridge}
        self.client_id = options["client_id"]
        self.session_expiry = int(
            broker_urls.seconds(options["session_expiry"], option="session_expiry", **check)
        )
        self.receive_maximum = broker_urls.count(
            options["receive_maximum"], option="receive_maximum", **check
        )
        self.keepalive = int(broker_urls.seconds(options["keepalive"], option="keepalive", **check))
        self.timeout = broker_urls.seconds(options["timeout"], option="timeout", **check)
        parts = urlsplit(bridge.url)
        self.tls = parts.scheme == "mqtts"
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (8883 if self.tls else 1883)
        self.username = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password) if parts.password else None
        self._client: mqtt.Client | None = None
        self._changed = threading.Condition()
        self._buffer: deque[Delivery] = deque()
        self._subscribed = False
        self._connected = False
        self._failure = ""

    # -- callbacks, run on paho's network thread ----------------------------------------------

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        with self._changed:
            if reason_code.is_failure:
                self._failure = f"CONNACK {reason_code}"
            else:
                self._connected = True
                client.subscribe(self.bridge.topic, qos=1)
            self._changed.notify_all()

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        with self._changed:
            failed = [code for code in reason_codes if code.is_failure]
            if failed:
                self._failure = f"SUBACK {failed[0]}"
            else:
                self._subscribed = True
            self._changed.notify_all()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        with self._changed:
            self._connected = False
            self._failure = self._failure or f"disconnected ({reason_code})"
            self._changed.notify_all()

    def _on_message(self, client, userdata, message) -> None:
        headers = dict(getattr(message.properties, "UserProperty", None) or [])
        delivery = Delivery(
            body=message.payload,
            headers=headers,
            properties={"topic": message.topic},
            position="",
            token=message,
        )
        with self._changed:
            self._buffer.append(delivery)
            self._changed.notify_all()

    # -- consuming -----------------------------------------------------------------------------

    def _down(self, reason: str) -> errors.BrokerUnavailable:
        self.close()
        return errors.BrokerUnavailable(
            f"bridge {self.bridge.name} ({broker_urls.redact(self.bridge.url)}): {reason}"
        )

    def _open(self) -> None:
        if self._client is not None:
            if not self._connected:
                raise self._down(self._failure or "disconnected")
            return
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=mqtt.MQTTv5,
            reconnect_on_failure=False,  # the bridge reconnects, with its own backoff
            manual_ack=True,  # PUBACK only once the message is stored
        )
        client.on_connect = self._on_connect
        client.on_subscribe = self._on_subscribe
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        if self.username is not None:
            client.username_pw_set(self.username, self.password)
        if self.tls:
            client.tls_set()
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = self.session_expiry
        properties.ReceiveMaximum = self.receive_maximum
        self._client = client
        try:
            client.connect(
                self.host,
                self.port,
                keepalive=self.keepalive,
                clean_start=False,  # the persistent session: what was not acknowledged comes back
                properties=properties,
            )
        except (OSError, ValueError) as exc:
            raise self._down(broker_urls.short(exc)) from exc
        client.loop_start()
        deadline = time.monotonic() + self.timeout
        with self._changed:
            while not self._subscribed and not self._failure:
                if not self._changed.wait(max(deadline - time.monotonic(), 0)):
                    break
        if not self._subscribed:
            raise self._down(self._failure or "no CONNACK or SUBACK in time")

    def fetch(self, limit: int) -> list[Delivery]:
        self._open()
        # The broker sends the next messages once the last ones were acknowledged (its
        # in-flight window is small: Mosquitto's max_inflight_messages is 20 by default):
        # wait a moment for them rather than a whole poll later.
        with self._changed:
            if not self._buffer:
                self._changed.wait(self.bridge.poll)
        return [self._buffer.popleft() for _ in range(min(limit, len(self._buffer)))]

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        client = self._client
        if client is None or not self._connected:
            raise self._down(self._failure or "disconnected before the acknowledgement")
        for delivery in deliveries:
            result = client.ack(delivery.token.mid, delivery.token.qos)
            if result != mqtt.MQTT_ERR_SUCCESS:
                raise self._down(f"PUBACK not sent: {mqtt.error_string(result)}")

    def lag(self) -> int | None:
        return None  # MQTT brokers do not tell a client what its session holds

    def close(self) -> None:
        client, self._client = self._client, None
        self._buffer.clear()  # unacknowledged: the session sends them again
        if client is not None:
            try:
                client.disconnect()
            except Exception:  # closing is best effort: the socket is dropped either way
                pass
            client.loop_stop()
        self._connected = self._subscribed = False


def consumer(bridge: Bridge) -> MqttConsumer:
    return MqttConsumer(bridge)
