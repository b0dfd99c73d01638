"""Channel declarations, the registry of channels and listeners, and the @listener decorator."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any, ClassVar, Literal, dataclass_transform

from pgmsg.core import asynchrony, errors, names, payload_types

EXACTLY_ONCE = "exactly_once"
BROADCAST = "broadcast"
Delivery = Literal["exactly_once", "broadcast"]

#: Prefix of the NOTIFY channel that carries a broadcast channel's payloads.
BROADCAST_PREFIX = "pgmsg:"


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


@dataclasses.dataclass(frozen=True)
class ChannelSpec:
    """What the registry knows of a channel."""

    name: str
    delivery: Delivery
    max_attempts: int | None
    #: The declared dataclass (for declared channels) or None (trigger channels).
    payload_class: type | None = None
    #: The model whose writes fill the channel (trigger channels).
    model: Any = None

    @property
    def is_trigger(self) -> bool:
        return self.model is not None


@dataclass_transform()
class Channel:
    """Base of declared channels. A subclass is a dataclass whose fields are the payload.

    ::

        class OrderPlaced(pgmsg.Channel, name="order_placed"):
            order_id: int
            total: Decimal

    Class keywords: ``name`` (default: the class name in snake_case), ``delivery``
    (``"exactly_once"``, the default, or ``"broadcast"``) and ``max_attempts`` (default:
    ``PGMSG["MAX_ATTEMPTS"]``).
    """

    pgmsg_channel: ClassVar[ChannelSpec]

    def __init_subclass__(
        cls,
        *,
        name: str | None = None,
        delivery: Delivery = EXACTLY_ONCE,
        max_attempts: int | None = None,
        **kwargs,
    ) -> None:
        super().__init_subclass__(**kwargs)
        if "__dataclass_fields__" not in cls.__dict__:
            dataclasses.dataclass(cls)
        if delivery not in (EXACTLY_ONCE, BROADCAST):
            raise errors.ConfigurationError(
                f"{cls.__qualname__}: delivery must be {EXACTLY_ONCE!r} or {BROADCAST!r}, "
                f"got {delivery!r}"
            )
        if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
            raise errors.ConfigurationError(
                f"{cls.__qualname__}: max_attempts must be a positive int, got {max_attempts!r}"
            )
        spec = ChannelSpec(
            name=names.validate_name(name or _snake(cls.__name__)),
            delivery=delivery,
            max_attempts=max_attempts,
            payload_class=cls,
        )
        cls.pgmsg_channel = spec
        registry.add_channel(spec)


Listener = Callable[[Any], Any]


class Registry:
    """Channels by name, and the listeners of each."""

    def __init__(self) -> None:
        self.channels: dict[str, ChannelSpec] = {}
        self.listeners: dict[str, list[Listener]] = {}

    def add_channel(self, spec: ChannelSpec) -> None:
        known = self.channels.get(spec.name)
        if known is not None and not _same_declaration(known, spec):
            raise errors.ChannelAlreadyRegistered(
                f"channel {spec.name!r} is declared twice: by {_origin(known)} and {_origin(spec)}"
            )
        if spec.payload_class is not None:
            payload_types.check_supported(spec.payload_class)
        self.channels[spec.name] = spec

    def add_listener(self, channel: str, func: Listener) -> None:
        funcs = self.listeners.setdefault(channel, [])
        key = _qualname(func)
        # A module imported twice (autodiscovery and a test, say) must not register twice.
        funcs[:] = [f for f in funcs if _qualname(f) != key]
        funcs.append(func)

    def get(self, name: str) -> ChannelSpec:
        try:
            return self.channels[name]
        except KeyError:
            raise errors.UnknownChannel(
                f"no channel named {name!r} is declared; known channels: {sorted(self.channels)}"
            ) from None


def _qualname(func: Callable) -> str:
    return f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', repr(func))}"


def _origin(spec: ChannelSpec) -> str:
    if spec.payload_class is not None:
        return f"{spec.payload_class.__module__}.{spec.payload_class.__qualname__}"
    return f"a trigger on {spec.model._meta.label}"


def _same_declaration(a: ChannelSpec, b: ChannelSpec) -> bool:
    # Re-importing a module re-declares its classes; that is the same declaration.
    return _origin(a) == _origin(b) and a.delivery == b.delivery


registry = Registry()


def listener(channel: type[Channel] | str) -> Callable[[Listener], Listener]:
    """Register the decorated function as a listener of ``channel`` (a Channel class or name).

    Listeners of exactly-once channels run inside the transaction that acknowledges the
    message; several listeners of one channel all run, and fail or succeed together.
    """
    if isinstance(channel, type) and issubclass(channel, Channel):
        name = channel.pgmsg_channel.name
    else:
        name = names.validate_name(channel)

    def decorator(func: Listener) -> Listener:
        registry.add_listener(name, asynchrony.in_worker_thread(func))
        return func

    return decorator


def spec_of(message: Any) -> ChannelSpec:
    """The channel of a message instance, with a clear error for anything else."""
    spec = getattr(type(message), "pgmsg_channel", None)
    if not isinstance(spec, ChannelSpec) or spec.payload_class is not type(message):
        raise errors.UnknownChannel(
            f"{message!r} is not an instance of a declared pgmsg.Channel subclass"
        )
    return spec
