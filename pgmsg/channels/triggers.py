"""Trigger channels: PostgreSQL itself stores a message for every write to a model.

Declared in a model's ``Meta.triggers`` and installed by migrations like any django-pgtrigger
trigger, so raw SQL, ``bulk_create`` and ``update()`` are covered, not just ``save()``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from decimal import Decimal
from typing import Any

import pgtrigger
import psycopg
from django.contrib.postgres.fields import RangeField
from django.core.exceptions import ValidationError
from django.db import models
from psycopg import pq
from psycopg.adapt import Transformer

from pgmsg.channels import declarations as channels
from pgmsg.core import errors, names, sql

QUERIES = sql.load(__package__, "triggers.sql")

# django-pgtrigger refuses trigger names over 47 characters: it prefixes "pgtrigger_" and
# appends a 6-character model hash within PostgreSQL's 63-byte identifiers.
MAX_TRIGGER_NAME_LENGTH = pgtrigger.core.MAX_NAME_LENGTH
_PREFIX = "pgmsg_"


def trigger_name(channel: str) -> str:
    """The trigger's name for ``channel``: ``pgmsg_<channel with '.' as '_'>``, or, when that
    is too long for django-pgtrigger, its first part and a hash of the whole channel name.

    Stable across runs (migrations do not churn); names that fit are unchanged from before.
    """
    name = _PREFIX + channel.replace(".", "_")
    if len(name) <= MAX_TRIGGER_NAME_LENGTH:
        return name
    digest = hashlib.sha256(channel.encode()).hexdigest()[:10]
    return f"{name[: MAX_TRIGGER_NAME_LENGTH - len(digest) - 1]}_{digest}"


class ChannelTrigger(pgtrigger.Trigger):
    """A row-level AFTER trigger that stores ``{op, old, new}`` on an exactly-once channel.

    ::

        class Order(models.Model):
            class Meta:
                triggers = [
                    pgmsg.ChannelTrigger(
                        channel="order_changed",
                        operation=pgtrigger.Insert | pgtrigger.Update | pgtrigger.Delete,
                    )
                ]

    Listeners of ``"order_changed"`` receive a :class:`RowChange` with model instances. Every
    valid channel name works (up to 57 bytes); the trigger's name is derived from it (see
    :func:`trigger_name`) unless ``name`` is given.
    """

    when = pgtrigger.After
    level = pgtrigger.Row

    def __init__(self, *, channel: str, name: str | None = None, **kwargs: Any) -> None:
        self.channel = names.validate_name(channel)
        super().__init__(name=name or trigger_name(channel), **kwargs)
        if self.level != pgtrigger.Row or self.when != pgtrigger.After:
            raise errors.ConfigurationError(
                f"ChannelTrigger {self.name!r}: only row-level AFTER triggers carry rows"
            )

    def get_func(self, model: models.Model) -> str:
        # The loader drops a statement's last ";": PL/pgSQL needs it back.
        return QUERIES["row_change"].format(channel=self.channel) + ";"

    def register(self, *models_: Any) -> Any:
        result = super().register(*models_)
        for model in models_:
            channels.registry.add_channel(
                channels.ChannelSpec(
                    name=self.channel,
                    delivery=channels.EXACTLY_ONCE,
                    max_attempts=None,
                    model=model,
                )
            )
        return result


@dataclasses.dataclass(frozen=True)
class RowChange:
    """What a trigger channel's listener receives."""

    #: "INSERT", "UPDATE" or "DELETE".
    operation: str
    #: The row before the write (None for INSERT), as an unsaved-looking model instance.
    old: models.Model | None
    #: The row after the write (None for DELETE).
    new: models.Model | None
    model: type[models.Model]


def decode_row_change(model: type[models.Model], text: str) -> RowChange:
    """Build a RowChange from a trigger payload (JSON text), keeping numerics exact.

    A payload that does not fit the model (a column value its field cannot take) raises
    PayloadError: no retry can mend it, so the notification is dead at once.
    """
    try:
        data = json.loads(text, parse_float=Decimal)
        op = data["op"]
        old, new = data.get("old"), data.get("new")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise errors.PayloadError(
            f"trigger payload for {model._meta.label} is not {{op, old, new}}: {text[:200]}"
        ) from exc
    return RowChange(
        operation=op,
        old=_instance(model, old, "old"),
        new=_instance(model, new, "new"),
        model=model,
    )


def _instance(model: type[models.Model], row: Any, side: str) -> models.Model | None:
    if row is None:
        return None
    if not isinstance(row, dict):
        raise errors.PayloadError(
            f"trigger payload for {model._meta.label}: {side!r} is not a row: {row!r:.200}"
        )
    values = []
    names = []
    for field in model._meta.concrete_fields:
        if field.column not in row:
            continue
        try:
            value = _column_value(field, row[field.column])
        except (ValueError, TypeError, ArithmeticError, ValidationError) as exc:
            raise errors.PayloadError(
                f"trigger payload for {model._meta.label}: {side}.{field.column} = "
                f"{row[field.column]!r:.200} does not fit {type(field).__name__}: {exc}"
            ) from exc
        names.append(field.attname)
        values.append(value)
    return model.from_db(None, names, values)


def _column_value(field: models.Field, value: Any) -> Any:
    """A column's value as to_jsonb() wrote it -> the value the field holds when loaded."""
    if isinstance(field, models.JSONField):
        return _floats(value)
    if value is None:
        return None
    if isinstance(field, models.BinaryField) and isinstance(value, str):
        # to_jsonb(bytea) is PostgreSQL's hex text, "\\x0001fe"; to_python expects base64.
        if not value.startswith("\\x"):
            raise ValueError("bytea text should start with \\x")
        return bytes.fromhex(value[2:])
    if isinstance(field, RangeField):
        # to_jsonb(range) is the range's text ("[1,10)"): psycopg parses it as it would a
        # column of that type.
        return _range_loader(field.db_type(connection=None))(value)
    if isinstance(value, Decimal) and not isinstance(field, models.DecimalField):
        value = float(value) if isinstance(field, models.FloatField) else value
    return field.to_python(value)


@functools.cache
def _range_loader(db_type: str):
    oid = psycopg.postgres.types.get(db_type).oid
    loader = Transformer().get_loader(oid, pq.Format.TEXT)
    return lambda text: loader.load(text.encode())


def _floats(value: Any) -> Any:
    """JSON numbers parsed as Decimal go back to float inside JSONField values."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, list):
        return [_floats(v) for v in value]
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    return value
