"""Generated JSON encoders: per dataclass, a function made once that writes an instance whose
fields all hold plain values in one call (payloads.dumps' exact text), for notify()'s hot path."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from pgmsg.core import payloads


@cache
def plain_encoder(cls: type) -> Callable[[Any], str | None]:
    """Per dataclass: a function made once that gives the JSON text of an instance of ``cls``
    whose fields all hold a value of a type JSON gives back as it is (payloads.plain_fields),
    as payloads.dumps would write it, and None for anything else (a subclass, another field
    type, a NaN, a NUL character), which dumps and dumps_checked then take, with their errors.
    What it returns decodes back into ``cls`` unchanged, so it needs no decoding check.

    notify() calls it first: dumps_checked's steps (the field table's lookup, the dict built
    field by field, two more calls) cost a producer about 5 us of CPU a message between round
    trips, where its Python runs from cold caches (docs/decisions.md)."""
    plain = payloads.plain_fields(cls) if hasattr(cls, "__dataclass_fields__") else None
    if not plain:
        return _not_plain
    # Field names are Python identifiers (dataclass fields): safe to write into the source.
    names = [name for name, _ in plain]
    scope = {
        "cls": cls,
        "encode": payloads.encode_plain,
        "Error": (TypeError, ValueError),
        **{f"types_{i}": exact for i, (_, exact) in enumerate(plain)},
    }
    reads = "\n    ".join(f"v{i} = value.{name}" for i, name in enumerate(names))
    checks = " and ".join(f"type(v{i}) in types_{i}" for i in range(len(names)))
    items = ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names))
    source = f"""
def encode_plain(value):
    if type(value) is not cls:
        return None
    {reads}
    if not ({checks}):
        return None
    try:
        text = encode({{{items}}})
    except Error:
        return None
    return None if "u0000" in text else text
"""
    exec(source, scope)  # noqa: S102 -- text made above from field names and indexes only
    return scope["encode_plain"]


def _not_plain(value: Any) -> None:
    return None
