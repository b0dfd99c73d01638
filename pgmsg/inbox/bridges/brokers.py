"""Which module consumes each broker: one per kind, imported on first use (each imports its
client library, which a project that bridges from one broker need not have for the others)."""

from __future__ import annotations

from types import ModuleType

from pgmsg.core import errors
from pgmsg.inbox.bridges.declarations import Bridge


def _amqp() -> ModuleType:
    from pgmsg.inbox.bridges import amqp

    return amqp


def _nats() -> ModuleType:
    from pgmsg.inbox.bridges import nats

    return nats


def _redis() -> ModuleType:
    from pgmsg.inbox.bridges import redis

    return redis


def _mqtt() -> ModuleType:
    from pgmsg.inbox.bridges import mqtt

    return mqtt


#: URL scheme -> the loader of the module that consumes from it, and the package it needs.
LOADERS = {
    "amqp": (_amqp, "pika"),
    "amqps": (_amqp, "pika"),
    "nats": (_nats, "nats-py"),
    "tls": (_nats, "nats-py"),
    "redis": (_redis, "redis"),
    "rediss": (_redis, "redis"),
    "mqtt": (_mqtt, "paho-mqtt"),
    "mqtts": (_mqtt, "paho-mqtt"),
}


def module(bridge: Bridge) -> ModuleType:
    """The module that consumes ``bridge``'s broker (imports its client library)."""
    load, package = LOADERS[bridge.scheme]
    try:
        return load()
    except ImportError as exc:
        raise errors.UnknownBridge(
            f"bridge {bridge.name!r} needs the {package!r} package ({exc}); "
            f"pip install {package} (or pgmsg's extra: 'pgmsg[bridges]')"
        ) from exc
