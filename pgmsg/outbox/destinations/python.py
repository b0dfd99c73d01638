"""A Python callable as a destination (an HTTP webhook, a log, another system's client).

``func(envelope)`` returning means confirmed; raising BrokerUnavailable means "could not reach
it, try again later" (no attempt counted); any other exception is a refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from django.utils.module_loading import import_string

from pgmsg.core import errors
from pgmsg.outbox.destinations.base import Envelope, Outcome, short


class CallableDestination:
    def __init__(self, name: str, func: Callable[[Envelope], object]) -> None:
        self.name = name
        self.func = func

    def publish(self, envelopes: Sequence[Envelope]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for envelope in envelopes:
            try:
                self.func(envelope)
            except errors.BrokerUnavailable as exc:
                outcomes.append(exc)
            except Exception as exc:
                refused = errors.MessageRefused(f"{self.name}: {short(exc)}")
                refused.__cause__ = exc
                outcomes.append(refused)
            else:
                outcomes.append(None)
        return outcomes

    def close(self) -> None:
        pass


def from_setting(name: str, value: str) -> CallableDestination:
    try:
        func = import_string(value)
    except ImportError as exc:
        raise errors.UnknownDestination(
            f"destination {name!r}: cannot import the callable {value!r}: {exc}"
        ) from exc
    if not callable(func):
        raise errors.UnknownDestination(f"destination {name!r}: {value!r} is not callable")
    return CallableDestination(name, func)
