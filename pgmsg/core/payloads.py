"""Payload (de)serialisation: declared dataclass fields <-> JSON-safe values.

Encoding goes through Django's JSON encoder (datetimes, dates, times, decimals, UUIDs, enums
become strings); decoding walks the declared type hints and turns them back. Nothing is
unpickled or evaluated: unknown types are refused with the field's name.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import re
import types
import typing
import uuid
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from functools import cache
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.utils.dateparse import parse_date, parse_datetime, parse_time

from pgmsg.core import errors


class _Encoder(DjangoJSONEncoder):
    def default(self, o):
        # Django's encoder cuts datetimes and times to milliseconds; keep every microsecond.
        if isinstance(o, dt.datetime | dt.time):
            text = o.isoformat()
            return text[:-6] + "Z" if text.endswith("+00:00") else text
        if isinstance(o, enum.Enum):
            return o.value
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            return {f.name: getattr(o, f.name) for f in dataclasses.fields(o)}
        if isinstance(o, set | frozenset):
            return sorted(o, key=repr)
        return super().default(o)


# A NUL character as json.dumps writes it: \u0000 after an even number of backslashes.
_NUL_RE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


#: What json.dumps(value, cls=_Encoder, ...) would build on every call, built once.
_ENCODER = _Encoder(separators=(",", ":"), allow_nan=False)


#: The same output for dicts of JSON's own types, without the fallback for other types.
_PLAIN_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _plain_encode_function() -> Any:
    """_PLAIN_ENCODER.encode, or the same C encoder made once instead of on every call.

    JSONEncoder.encode makes json's C encoder anew for each value (its circular-reference
    check keeps state per call); the values encoded here hold only strings, numbers, booleans
    and None, so one encoder without that check serves every call, at half the cost of a
    small payload's encode (measured here). The arguments are those JSONEncoder.iterencode
    passes (the same in Python 3.6 to 3.13); without the C module, the plain encode."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _PLAIN_ENCODER.encode
    encoder = _PLAIN_ENCODER
    chunks_of = make(
        None,  # no circular-reference check: scalars only
        encoder.default,
        json.encoder.encode_basestring_ascii,
        None,
        encoder.key_separator,
        encoder.item_separator,
        encoder.sort_keys,
        encoder.skipkeys,
        encoder.allow_nan,
    )

    def encode(value: dict, join: Any = "".join) -> str:
        return join(chunks_of(value, 0))

    return encode


encode_plain = _plain_encode_function()


def dumps(value: Any) -> str:
    """JSON text of a dataclass instance or plain value; a clear error for what JSON can't hold."""
    return _dumps(value, _plain_dict(value))


def dumps_checked(
    cls: type, value: Any, *, what: str, skip: frozenset[str] = frozenset(), check: bool = True
) -> str:
    """dumps(value), and check_decodes(cls, ...) of it: a PayloadError naming ``what`` unless
    it decodes back into ``cls``. A value whose fields all hold exactly a str, int, float or
    bool (or None) of their declared types decodes back unchanged: it skips the decoding.
    ``skip``: fields left out of the JSON (an event's envelope); ``check=False``: no decoding
    check at all."""
    plain = _plain_dict(value, skip) if type(value) is cls else None
    if skip and plain is None:
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        value = {name: item for name, item in value.items() if name not in skip}
    text = _dumps(value, plain)
    if plain is None and check:
        check_decodes(cls, text, what=what)
    return text


def _plain_dict(value: Any, skip: frozenset[str] = frozenset()) -> dict | None:
    """The dict the encoder would make of a dataclass instance whose fields (but ``skip``) are
    all plain (see plain_fields), or None for anything else: a third of the cost of the
    general path, whose fallback runs for the instance (measured: about 20 us for a two-field
    channel)."""
    cls = type(value)
    plain = plain_fields(cls, skip) if hasattr(cls, "__dataclass_fields__") else None
    if plain is None:
        return None
    data = {}
    for name, ok in plain:
        item = getattr(value, name)
        if type(item) not in ok:
            return None
        data[name] = item
    return data


def _dumps(value: Any, plain: dict | None) -> str:
    try:
        text = _ENCODER.encode(value) if plain is None else encode_plain(plain)
    except (TypeError, ValueError) as exc:
        raise errors.PayloadError(f"cannot encode payload {value!r} as JSON: {exc}") from exc
    if "u0000" in text and _NUL_RE.search(text):
        raise errors.PayloadError(
            f"payload {value!r:.200} holds a NUL character (\\x00) in a string, which "
            "PostgreSQL's jsonb cannot store: strip it, or send the text encoded (base64)"
        )
    return text


@cache
def hints_of(cls: type) -> dict[str, Any]:
    """The type hints of dataclass ``cls``, looked up once."""
    return typing.get_type_hints(cls)


# json's C scanner without json.loads' Python wrapper (two whitespace regex matches per call,
# a third of its time on a small payload): jsonb's text form has no surrounding whitespace.
_scan_json = json.JSONDecoder().scan_once


def from_jsonb(text: str) -> Any:
    """The value of jsonb text (``payload::text``), as json.loads gives it; json.loads also
    reports bad input (ValueError), or takes what the scanner did not (surrounding spaces)."""
    try:
        value, end = _scan_json(text, 0)
    except StopIteration:
        end = -1
    return value if end == len(text) else json.loads(text)


def load(cls: type, data: Any, **given: Any) -> Any:
    """Build an instance of dataclass ``cls`` from decoded JSON, converting by type hints.

    ``given``: more constructor arguments, taken as they are (an event's stored message id and
    metadata, so that their default factories do not run for nothing).
    """
    direct = _direct_loader(cls, tuple(given)) if given else _direct_loader(cls, ())
    if direct is not None and (built := direct(data, given)) is not None:
        return built
    return _checked_dataclass(cls, data, cls.__name__, given)


@cache
def jsonb_decoder(cls: type) -> Callable[[str], Any]:
    """Per dataclass, a function made once: jsonb text (``payload::text``) -> an instance of
    ``cls``, as ``load(cls, from_jsonb(text))``; text that is not JSON raises PayloadError. A
    worker decodes each message of a batch with it: one call into it instead of four calls
    and a cache lookup through ``load``."""
    direct = _direct_loader(cls, ())

    def decode(text: str) -> Any:
        try:
            value = from_jsonb(text)
        except ValueError as exc:
            raise errors.PayloadError(f"payload is not JSON: {exc}") from exc
        # _load_dataclass's body with the loader looked up once: one call less per message.
        if direct is not None and (built := direct(value, None)) is not None:
            return built
        return _checked_dataclass(cls, value, cls.__name__)

    return decode


# JSON already yields these exact types; a value of exactly that type needs no conversion.
_PASS_THROUGH = {str: (str,), int: (int,), bool: (bool,), float: (float,)}


@cache
def _plan(
    cls: type,
) -> tuple[frozenset, frozenset, dict[str, tuple[Any, tuple]], dict[str, tuple]]:
    """Per dataclass, computed once: field names, required names, (hint, pass-through) and
    the pass-through types alone, by field name."""
    hints = hints_of(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    required = frozenset(
        name
        for name, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    return (
        frozenset(fields),
        required,
        {name: (hints[name], _PASS_THROUGH.get(hints[name], ())) for name in fields},
        {name: _PASS_THROUGH.get(hints[name], ()) for name in fields},
    )


def _load_dataclass(cls: type, value: Any, path: str) -> Any:
    direct = _direct_loader(cls, ())
    if direct is not None and (built := direct(value, None)) is not None:
        return built
    return _checked_dataclass(cls, value, path)


def _checked_dataclass(cls: type, value: Any, path: str, given: dict | None = None) -> Any:
    if not isinstance(value, dict):
        raise errors.PayloadError(f"{path}: expected a JSON object, got {value!r}")
    names, required, fields, exact = _plan(cls)
    keys = value.keys()
    if names >= keys and keys >= required:
        # Every value already of its field's exact type (the usual case): the decoded dict
        # is the constructor's arguments as it is.
        for key, item in value.items():
            if type(item) not in exact[key]:
                break
        else:
            return cls(**{**value, **given}) if given else cls(**value)
    if not (names >= keys and keys >= required):
        unknown = sorted(set(value) - names)
        missing = [name for name in fields if name in required and name not in keys]
        problems = ([f"missing field(s) {missing}"] if missing else []) + (
            [f"unknown field(s) {unknown}"] if unknown else []
        )
        raise errors.PayloadError(f"{path}: {', '.join(problems)}")
    kwargs = {}
    for key, item in value.items():
        hint, exact = fields[key]
        kwargs[key] = item if type(item) in exact else _convert(hint, item, f"{path}.{key}")
    if given:
        kwargs.update(given)
    return cls(**kwargs)


@cache
def _direct_loader(cls: type, given: tuple[str, ...]) -> Any:
    """Per dataclass (and names of arguments given apart): a function made once that builds
    ``cls`` from a decoded JSON object holding exactly its other fields, each of a type JSON
    gives as it is (``plain_fields``); it returns None for anything else, which the checks of
    ``_load_dataclass`` then take (defaults, conversions, errors). None when ``cls`` has a
    field of another type. The checks cost about three times the constructor's call on a
    small payload; this costs about one more (measured here, two fields: payloads.load 1.02 ->
    0.60 us, the constructor alone 0.26)."""
    plain = plain_fields(cls, frozenset(given))
    if not plain:
        return None
    # Field names are Python identifiers (dataclass fields): safe to write into the source.
    names = [name for name, _ in plain]
    scope = {"cls": cls, **{f"types_{i}": exact for i, (_, exact) in enumerate(plain)}}
    values = ", ".join(f"v{i}" for i in range(len(names)))
    lookups = ", ".join(f"value[{name!r}]" for name in names)
    checks = " and ".join(f"type(v{i}) in types_{i}" for i in range(len(names)))
    arguments = ", ".join(f"{name}=v{i}" for i, name in enumerate(names))
    source = f"""
def load(value, given):
    if type(value) is not dict or len(value) != {len(names)}:
        return None
    try:
        {values}, = {lookups},
    except KeyError:
        return None
    if {checks}:
        return cls({arguments}, **given) if given else cls({arguments})
    return None
"""
    exec(source, scope)  # noqa: S102 -- text made above from field names and indexes only
    return scope["load"]


def check_decodes(cls: type, text: str, *, what: str) -> None:
    """Raise PayloadError (naming ``what``) unless ``text`` decodes back into ``cls``.

    Senders call this with the JSON they are about to store, so a value that the worker could
    not decode (``order_id='x'`` for an ``int`` field) fails in the sending code, not later as
    a dead letter. The check is the worker's own decoding, run once more.
    """
    try:
        load(cls, json.loads(text))
    except errors.PayloadError as exc:
        raise errors.PayloadError(f"{what}: {exc}") from exc


@cache
def plain_fields(
    cls: type, skip: frozenset[str] = frozenset()
) -> tuple[tuple[str, tuple[type, ...]], ...] | None:
    """Per dataclass: each field (but ``skip``) with the types whose JSON decodes back into it
    unchanged (``int`` for ``int``, ``int`` or ``None`` for ``int | None``, ...), or None when
    a field has any other type or is not an ``__init__`` argument (those need the full
    check)."""
    hints = hints_of(cls)
    plain = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        hint = hints.get(f.name)
        exact = _PASS_THROUGH.get(hint)
        if exact is None and typing.get_origin(hint) in (typing.Union, types.UnionType):
            args = typing.get_args(hint)
            others = [a for a in args if a is not type(None)]
            if len(args) == 2 and len(others) == 1 and others[0] in _PASS_THROUGH:
                exact = (*_PASS_THROUGH[others[0]], type(None))
        if exact is None or not f.init:
            return None
        plain.append((f.name, exact))
    return tuple(plain)


def _convert(hint: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    if hint is Any or hint is object:
        return value
    if origin in (typing.Union, types.UnionType):
        return _convert_union(hint, value, path)
    if value is None:
        raise errors.PayloadError(f"{path}: null is not allowed for {type_name(hint)}")
    if origin is typing.Literal:
        if value not in typing.get_args(hint):
            raise errors.PayloadError(f"{path}: {value!r} is not one of {typing.get_args(hint)}")
        return value
    if origin in (list, tuple, set, frozenset):
        return _convert_array(hint, origin, value, path)
    if origin is dict:
        if not isinstance(value, dict):
            raise errors.PayloadError(f"{path}: expected a JSON object, got {value!r}")
        key_t, val_t = typing.get_args(hint) or (str, Any)
        return {
            _convert(key_t, k, f"{path}.key"): _convert(val_t, v, f"{path}[{k!r}]")
            for k, v in value.items()
        }
    if dataclasses.is_dataclass(hint):
        return _load_dataclass(hint, value, path)
    return _scalar(hint, value, path)


def _convert_union(hint: Any, value: Any, path: str) -> Any:
    """The first of a union's types that takes ``value`` (null for an optional one)."""
    args = typing.get_args(hint)
    if value is None and type(None) in args:
        return None
    failures = []
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _convert(arg, value, path)
        except errors.PayloadError as exc:
            failures.append(str(exc))
    raise errors.PayloadError("; ".join(failures) or f"{path}: null is not allowed")


def _convert_array(hint: Any, origin: Any, value: Any, path: str) -> Any:
    """A JSON array as a list, set, frozenset or tuple (of fixed length, or ``tuple[T, ...]``)."""
    if not isinstance(value, list):
        raise errors.PayloadError(f"{path}: expected a JSON array, got {value!r}")
    args = typing.get_args(hint)
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(args) != len(value):
            raise errors.PayloadError(f"{path}: expected {len(args)} items, got {len(value)}")
        return tuple(_convert(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    item = args[0] if args else Any
    return origin(_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value))


#: What a scalar parser returns for a value of the wrong JSON type.
_INVALID = object()


def _exactly(kind: type, value: Any) -> Any:
    return value if isinstance(value, kind) and not isinstance(value, bool) else _INVALID


def _number(value: Any, make: Callable[[Any], Any]) -> Any:
    return (
        make(value) if isinstance(value, int | float) and not isinstance(value, bool) else _INVALID
    )


def _parsed(value: Any, parse: Callable[[Any], Any]) -> Any:
    parsed = parse(value)
    return _INVALID if parsed is None else parsed


#: A scalar type -> its parser from a JSON value (_INVALID: not one; or raises ValueError...).
_SCALARS: dict[Any, Callable[[Any], Any]] = {
    bool: lambda v: v if isinstance(v, bool) else _INVALID,
    int: lambda v: _exactly(int, v),
    float: lambda v: _number(v, float),
    str: lambda v: _exactly(str, v),
    Decimal: lambda v: (
        Decimal(str(v)) if isinstance(v, str) else _number(v, lambda n: Decimal(str(n)))
    ),
    uuid.UUID: uuid.UUID,
    dt.datetime: lambda v: _parsed(v, parse_datetime),
    dt.date: lambda v: _parsed(v, parse_date),
    # fromisoformat keeps a UTC offset ("10:00:00+02:00"); parse_time would drop it.
    dt.time: lambda v: _parsed(v, lambda t: _time_with_offset(t) or parse_time(t)),
}


def _scalar(hint: Any, value: Any, path: str) -> Any:
    parse = _SCALARS.get(hint) if isinstance(hint, type) else None
    if parse is None:
        if not (isinstance(hint, type) and issubclass(hint, enum.Enum)):
            raise errors.PayloadError(
                f"{path}: type {type_name(hint)} is not supported in payloads"
            )
        parse = hint
    try:
        parsed = parse(value)
    except (TypeError, ValueError, AttributeError, InvalidOperation) as exc:
        raise errors.PayloadError(f"{path}: {value!r} is not a valid {type_name(hint)}") from exc
    if parsed is _INVALID:
        raise errors.PayloadError(f"{path}: {value!r} is not a valid {type_name(hint)}")
    return parsed


def type_name(hint: Any) -> str:
    """A type hint as error messages name it."""
    return getattr(hint, "__name__", None) or str(hint)


def _time_with_offset(value: str) -> dt.time | None:
    try:
        return dt.time.fromisoformat(value)
    except ValueError:
        return None
