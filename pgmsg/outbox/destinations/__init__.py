"""Destinations by name, from PGMSG["OUTBOX_DESTINATIONS"]: one module per kind of broker.

A value is a broker URL (``amqp://``, ``nats://``, ``redis://``, ``mqtt://``), a webhook URL
(``https://``, ``http://``) or the dotted path
of a Python callable. Connections are made lazily and kept per process (a forked worker makes
its own).
"""

from __future__ import annotations

import os
from types import ModuleType
from urllib.parse import urlsplit

from django.core.signals import setting_changed

from pgmsg.core import conf, errors
from pgmsg.outbox.destinations import python
from pgmsg.outbox.destinations.base import Destination, Envelope, Outcome, redact

__all__ = ["Destination", "Envelope", "Outcome", "close_all", "get", "make", "validate"]


# Each broker's module is imported on first use: it imports its client library (the outbox
# extra), which a project that publishes to one broker need not have for the others.


def _amqp() -> ModuleType:
    from pgmsg.outbox.destinations import amqp

    return amqp


def _nats() -> ModuleType:
    from pgmsg.outbox.destinations import nats

    return nats


def _redis() -> ModuleType:
    from pgmsg.outbox.destinations import redis

    return redis


def _http() -> ModuleType:
    from pgmsg.outbox.destinations import http

    return http


def _mqtt() -> ModuleType:
    from pgmsg.outbox.destinations import mqtt

    return mqtt


#: URL scheme -> the loader of the module (in this folder) that publishes to it, and the
#: package that module needs.
SCHEMES = {
    "amqp": (_amqp, "pika"),
    "amqps": (_amqp, "pika"),
    "nats": (_nats, "nats-py"),
    "tls": (_nats, "nats-py"),
    "redis": (_redis, "redis"),
    "rediss": (_redis, "redis"),
    "mqtt": (_mqtt, "paho-mqtt"),
    "mqtts": (_mqtt, "paho-mqtt"),
    "http": (_http, "the standard library's http.client"),
    "https": (_http, "the standard library's http.client"),
}

_open: dict[str, Destination] = {}
_pid = os.getpid()


def _module(name: str, value: object):
    if not isinstance(value, str) or not value:
        raise errors.UnknownDestination(
            f"PGMSG['OUTBOX_DESTINATIONS'][{name!r}] must be a URL or a dotted path, got {value!r}"
        )
    if "://" not in value:
        return python
    scheme = urlsplit(value).scheme
    if scheme not in SCHEMES:
        raise errors.UnknownDestination(
            f"destination {name!r}: {redact(value)} has scheme {scheme!r}; pgmsg publishes to "
            f"{sorted(SCHEMES)} or to a Python callable (a dotted path)"
        )
    load, package = SCHEMES[scheme]
    try:
        return load()
    except ImportError as exc:
        raise errors.UnknownDestination(
            f"destination {name!r} needs the {package!r} package ({exc}); "
            f"pip install {package} (or the checkout with its extra: './pgmsg[outbox]')"
        ) from exc


def url_of(name: str) -> str:
    found = conf.get().OUTBOX_DESTINATIONS.get(name)
    if found is None:
        raise errors.UnknownDestination(
            f"no destination named {name!r} in PGMSG['OUTBOX_DESTINATIONS']; known: "
            f"{sorted(conf.get().OUTBOX_DESTINATIONS)}"
        )
    return found


def make(name: str, value: str) -> Destination:
    """A new, not yet connected destination for ``value`` (a URL or a dotted path)."""
    return _module(name, value).from_setting(name, value)


def validate(name: str, value: object) -> None:
    """Raise UnknownDestination when ``value`` cannot be used (what the system check runs)."""
    make(name, value)  # parses and imports; connects nothing


def get(name: str) -> Destination:
    """The destination ``name`` of this process, connected on first publish."""
    global _pid
    if os.getpid() != _pid:  # forked: the parent's sockets are not ours
        _open.clear()
        _pid = os.getpid()
    found = _open.get(name)
    if found is None:
        found = _open[name] = make(name, url_of(name))
    return found


def close_all() -> None:
    for destination in list(_open.values()):
        try:
            destination.close()
        except Exception:  # closing is best effort; the connection is dropped either way
            pass
    _open.clear()


def _reset(setting, **kwargs):
    if setting == "PGMSG":
        close_all()


setting_changed.connect(_reset)
