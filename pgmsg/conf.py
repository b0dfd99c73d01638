"""pgmsg's settings: the ``PGMSG`` dict in Django settings, with typed defaults."""

from __future__ import annotations

import dataclasses
from functools import cache

from django.conf import settings as django_settings
from django.core.signals import setting_changed

from pgmsg import errors


@dataclasses.dataclass(frozen=True)
class Settings:
    #: Database alias that holds pgmsg's tables and runs handlers.
    DATABASE: str = "default"
    #: Stored notifications claimed per transaction by a worker.
    BATCH_SIZE: int = 100
    #: Attempts before a failing notification becomes a dead letter.
    MAX_ATTEMPTS: int = 5
    #: First retry delay in seconds; doubles with each attempt, up to RETRY_BACKOFF_MAX.
    RETRY_BACKOFF: float = 1.0
    RETRY_BACKOFF_MAX: float = 300.0
    #: Run every message under its own savepoint (one extra round trip each) instead of one
    #: savepoint per batch with a per-message re-run only when a handler fails.
    SAVEPOINT_PER_MESSAGE: bool = False
    #: Seconds between sweeps for rows whose NOTIFY was missed, and for due retries.
    SWEEP_INTERVAL: float = 5.0
    #: Longest pause, in seconds, between attempts to reconnect a lost database connection.
    RECONNECT_BACKOFF_MAX: float = 10.0
    #: Spark master of manage.py pgmsg_export when --master is not given.
    EXPORT_SPARK_MASTER: str = "local[*]"
    #: Rows per Spark read partition when --partitions is not given.
    EXPORT_ROWS_PER_PARTITION: int = 250_000
    #: Inbox retention, in seconds: processed messages are deleted this long after processing
    #: (their ids stop deduplicating then), dead and discarded ones after INBOX_DEAD_RETENTION.
    INBOX_RETENTION: float = 72 * 3600.0
    INBOX_DEAD_RETENTION: float = 7 * 24 * 3600.0
    #: Seconds between the retention passes a worker runs on each inbox it serves.
    INBOX_RETENTION_INTERVAL: float = 300.0
    #: An inbox is "degraded" from this many pending messages, dead letters, or seconds of age
    #: of its oldest pending message.
    INBOX_DEGRADED_PENDING: int = 10_000
    INBOX_DEGRADED_DEAD: int = 1
    INBOX_DEGRADED_AGE: float = 300.0


def _check_types(values: dict) -> Settings:
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise errors.ConfigurationError(
            f"Unknown PGMSG setting(s) {unknown}; known settings are {sorted(fields)}"
        )
    for key, value in values.items():
        expected = fields[key].type
        ok = {
            "str": isinstance(value, str),
            "int": isinstance(value, int) and not isinstance(value, bool) and value > 0,
            "float": isinstance(value, int | float) and not isinstance(value, bool) and value > 0,
            "bool": isinstance(value, bool),
        }[expected]
        if not ok:
            raise errors.ConfigurationError(
                f"PGMSG[{key!r}] must be "
                f"{'a bool' if expected == 'bool' else 'a positive ' + expected}, got {value!r}"
            )
    return Settings(**values)


@cache
def get() -> Settings:
    """The current settings (cached; reset when tests override PGMSG)."""
    return _check_types(dict(getattr(django_settings, "PGMSG", {}) or {}))


def _reset(setting, **kwargs):
    if setting == "PGMSG":
        get.cache_clear()


setting_changed.connect(_reset)
