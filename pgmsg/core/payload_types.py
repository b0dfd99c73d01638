"""What a payload field may be: checked once, when a channel, event or outbox message type is
declared, so that a type payloads cannot carry fails at import, not on the first send."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import types
import typing
import uuid
from decimal import Decimal
from typing import Any

from pgmsg.core import errors
from pgmsg.core.payloads import hints_of, type_name


def check_supported(cls: type) -> None:
    """Refuse, at declaration time, field types that payloads cannot carry."""
    for name, hint in hints_of(cls).items():
        _check_hint(hint, f"{cls.__name__}.{name}")


_SCALARS = (bool, int, float, str, Decimal, uuid.UUID, dt.datetime, dt.date, dt.time)


def _check_hint(hint: Any, path: str) -> None:
    if hint is Any or hint is object or hint is type(None) or hint in _SCALARS:
        return
    origin = typing.get_origin(hint)
    if origin is typing.ClassVar:
        return
    if origin is typing.Literal:
        return
    if origin in (typing.Union, types.UnionType, list, tuple, set, frozenset, dict):
        for arg in typing.get_args(hint):
            if arg is not Ellipsis:
                _check_hint(arg, path)
        return
    if dataclasses.is_dataclass(hint):
        check_supported(hint)
        return
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return
    raise errors.ConfigurationError(
        f"{path}: type {type_name(hint)} cannot be carried in a payload; use str, int, float, "
        "bool, Decimal, UUID, datetime, date, time, an Enum, a dataclass, or list/dict of those"
    )
