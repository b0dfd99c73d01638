"""Trigger channels: PostgreSQL itself stores a message for every write to a model.

Declared in a model's ``Meta.triggers`` and installed by migrations like any django-pgtrigger
trigger, so raw SQL, ``bulk_create`` and ``update()`` are covered, not just ``save()``.
"""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal
from typing import Any

import pgtrigger
from django.db import models

from pgmsg import channels, errors


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

    Listeners of ``"order_changed"`` receive a :class:`RowChange` with model instances.
    """

    when = pgtrigger.After
    level = pgtrigger.Row

    def __init__(self, *, channel: str, name: str | None = None, **kwargs: Any) -> None:
        self.channel = channels.validate_name(channel)
        super().__init__(name=name or "pgmsg_" + channel.replace(".", "_"), **kwargs)
        if self.level != pgtrigger.Row or self.when != pgtrigger.After:
            raise errors.ConfigurationError(
                f"ChannelTrigger {self.name!r}: only row-level AFTER triggers carry rows"
            )

    def get_func(self, model: models.Model) -> str:
        # The channel name is validated to [a-z0-9_.-], so it is safe as a literal here.
        # OLD is NULL on INSERT and NEW on DELETE (PostgreSQL 11+).
        return (
            "INSERT INTO pgmsg_notification (channel, payload) VALUES ("
            f"'{self.channel}', jsonb_build_object("
            "'op', TG_OP, "
            "'old', CASE WHEN TG_OP = 'INSERT' THEN NULL ELSE to_jsonb(OLD) END, "
            "'new', CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE to_jsonb(NEW) END));\n"
            "RETURN NULL;"
        )

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
    """Build a RowChange from a trigger payload (JSON text), keeping numerics exact."""
    data = json.loads(text, parse_float=Decimal)
    try:
        op = data["op"]
        return RowChange(
            operation=op,
            old=_instance(model, data.get("old")),
            new=_instance(model, data.get("new")),
            model=model,
        )
    except (KeyError, TypeError) as exc:
        raise errors.PayloadError(
            f"trigger payload for {model._meta.label} is not {{op, old, new}}: {text[:200]}"
        ) from exc


def _instance(model: type[models.Model], row: dict | None) -> models.Model | None:
    if row is None:
        return None
    values = []
    names = []
    for field in model._meta.concrete_fields:
        if field.column not in row:
            continue
        value = row[field.column]
        if isinstance(field, models.JSONField):
            value = _floats(value)
        elif value is not None:
            if isinstance(value, Decimal) and not isinstance(field, models.DecimalField):
                value = float(value) if isinstance(field, models.FloatField) else value
            value = field.to_python(value)
        names.append(field.attname)
        values.append(value)
    return model.from_db(None, names, values)


def _floats(value: Any) -> Any:
    """JSON numbers parsed as Decimal go back to float inside JSONField values."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, list):
        return [_floats(v) for v in value]
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    return value
