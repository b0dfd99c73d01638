"""MQTT through paho-mqtt: QoS 1, each message counts as sent once its PUBACK arrived (a
PUBACK whose MQTT 5 reason code is a failure is a refusal).

URL: ``mqtt://user:pass@host:1883`` (``mqtts://`` for TLS with the system's CAs). pgmsg's
options: ``timeout`` (seconds; default PGMSG OUTBOX_PUBLISH_TIMEOUT), ``keepalive`` (seconds,
default 30), ``retain`` (0, the default, or 1). The topic is the MQTT topic. MQTT 5 is spoken:
the headers travel as user properties, the message id among them (``pgmsg-message-id``).
How durable a PUBACKed message is depends on the broker's persistence settings.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Sequence
from urllib.parse import unquote, urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

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


class MqttDestination:
    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        _, options = split_options(url, {"timeout": "", "keepalive": "30", "retain": "0"})
        timeout = options["timeout"] or str(conf.get().OUTBOX_PUBLISH_TIMEOUT)
        self.timeout = seconds(timeout, option="timeout", url=url)
        self.keepalive = int(seconds(options["keepalive"], option="keepalive", url=url))
        self.retain = flag(options["retain"], option="retain", url=url)
        parts = urlsplit(url)
        self.tls = parts.scheme == "mqtts"
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (8883 if self.tls else 1883)
        self.username = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password) if parts.password else None
        self._client: mqtt.Client | None = None
        self._changed = threading.Condition()
        self._acks: dict[int, object] = {}  # mid -> reason code, filled by the network thread
        self._connected = False

    # -- callbacks, run on paho's network thread ----------------------------------------------

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        with self._changed:
            self._connected = not reason_code.is_failure
            self._connect_reason = reason_code
            self._changed.notify_all()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        with self._changed:
            self._connected = False
            self._changed.notify_all()

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        with self._changed:
            self._acks[mid] = reason_code
            self._changed.notify_all()

    # -- publishing ----------------------------------------------------------------------------

    def _connect(self) -> mqtt.Client:
        if self._client is not None and self._connected:
            return self._client
        self.close()
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"pgmsg-{self.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
            reconnect_on_failure=False,  # the relay reconnects, with its own backoff
        )
        client.max_inflight_messages_set(1000)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        if self.username is not None:
            client.username_pw_set(self.username, self.password)
        if self.tls:
            client.tls_set()
        self._connect_reason = None
        try:
            client.connect(self.host, self.port, keepalive=self.keepalive)
        except (OSError, ValueError) as exc:
            raise errors.BrokerUnavailable(f"{self.name} ({redact(self.url)}): {short(exc)}")
        client.loop_start()
        self._client = client
        deadline = time.monotonic() + self.timeout
        with self._changed:
            while not self._connected and self._connect_reason is None:
                if not self._changed.wait(max(deadline - time.monotonic(), 0)):
                    break
        if not self._connected:
            self.close()
            raise errors.BrokerUnavailable(
                f"{self.name} ({redact(self.url)}): no CONNACK"
                + (f" ({self._connect_reason})" if self._connect_reason is not None else "")
            )
        return client

    def publish(self, envelopes: Sequence[Envelope]) -> list[Outcome]:
        client = self._connect()
        outcomes: list[Outcome | int] = []
        for e in envelopes:
            properties = Properties(PacketTypes.PUBLISH)
            properties.ContentType = "application/json"
            properties.UserProperty = list(e.broker_headers().items())
            try:
                info = client.publish(
                    e.topic, e.body, qos=1, retain=self.retain, properties=properties
                )
            except ValueError as exc:  # e.g. a topic with wildcards: paho refuses it
                outcomes.append(errors.MessageRefused(f"{self.name}: {short(exc)}"))
                continue
            if info.rc != mqtt.MQTT_ERR_SUCCESS:
                outcomes.append(
                    errors.BrokerUnavailable(f"{self.name}: {mqtt.error_string(info.rc)}")
                )
            else:
                outcomes.append(info.mid)
        mids = {o for o in outcomes if isinstance(o, int)}
        deadline = time.monotonic() + self.timeout
        with self._changed:
            while self._connected and not mids.issubset(self._acks):
                if not self._changed.wait(max(deadline - time.monotonic(), 0)):
                    break
            acks = {mid: self._acks.pop(mid) for mid in mids if mid in self._acks}
        result: list[Outcome] = []
        for outcome in outcomes:
            if not isinstance(outcome, int):
                result.append(outcome)
            elif outcome not in acks:
                result.append(errors.BrokerUnavailable(f"{self.name}: no PUBACK in time"))
            elif getattr(acks[outcome], "is_failure", False):
                result.append(errors.MessageRefused(f"{self.name}: PUBACK {acks[outcome]}"))
            else:
                result.append(None)
        if any(isinstance(o, errors.BrokerUnavailable) for o in result):
            self.close()
        return result

    def close(self) -> None:
        client, self._client = self._client, None
        self._connected = False
        if client is not None:
            try:
                client.disconnect()
            except Exception:  # closing is best effort: the socket is dropped either way
                pass
            client.loop_stop()
        with self._changed:
            self._acks.clear()


def from_setting(name: str, url: str) -> MqttDestination:
    return MqttDestination(name, url)
