"""pgmsg's settings: the ``PGMSG`` dict in Django settings, with typed defaults."""

from __future__ import annotations

import dataclasses
from functools import cache

from django.conf import settings as django_settings
from django.core.signals import setting_changed

from pgmsg.core import errors


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
    #: Check at notify() and append() that a message decodes back into its declared types
    #: (the worker's own decoding, run once more), so a bad value raises PayloadError in the
    #: sending code instead of becoming a dead letter. Costs one decode per message.
    VALIDATE_ON_SEND: bool = True
    #: Send notify()'s statement, and the worker's first statement of each batch, through
    #: Django's cursor wrapper even when no execute wrapper is installed and queries are not
    #: logged: for instrumentation that patches Django's cursor class (some APM agents). Off,
    #: they go to libpq or psycopg's cursor of the same connection, in the same transaction
    #: (core/libpq.py, docs/wakeups.md).
    SEND_THROUGH_DJANGO_CURSOR: bool = False
    #: Prepare notify()'s, append()'s and receive()'s statements on each connection on their
    #: first use and run them by name from then on (the server skips their parse and plan: about
    #: a third of a one-message notify()'s server time). None (the default): yes, unless the
    #: database's settings say a transaction-mode pooler may sit in between (Django's
    #: DISABLE_SERVER_SIDE_CURSORS, or OPTIONS that set prepare_threshold to None); False
    #: behind a pooler that loses prepared statements (PgBouncer before 1.21, or without
    #: max_prepared_statements). docs/operations.md.
    PREPARE_STATEMENTS: bool | None = None
    #: Seconds between sweeps for rows whose NOTIFY was missed, and for due retries.
    SWEEP_INTERVAL: float = 5.0
    #: Seconds without work before a busy worker declares itself idle (docs/wakeups.md); until
    #: then it looks for work after 1, 2, 4, ... ms, so a steady stream of producers never has
    #: to NOTIFY (NOTIFY serializes commits). Work found again within it makes an idle worker
    #: busy; a message that comes alone is handled without leaving the idle state.
    IDLE_AFTER: float = 0.01
    #: Longest pause, in seconds, between attempts to reconnect a lost database connection.
    RECONNECT_BACKOFF_MAX: float = 10.0
    #: Seconds a worker's batch transaction may sit idle (its handler not talking to the
    #: database) before PostgreSQL ends the session and the batch goes back to other workers:
    #: the bound on how long a frozen (SIGSTOPped, swapping, partitioned) worker holds its
    #: batch. It is the worker sessions' idle_in_transaction_session_timeout; their TCP
    #: keepalives and tcp_user_timeout derive from it, so a vanished worker host is noticed
    #: in about that time too. A handler that spends longer than this outside the database
    #: (one HTTP call, say) loses its session: raise it for such handlers.
    WORKER_IDLE_TIMEOUT: float = 30.0
    #: Spark master of manage.py pgmsg_export when --master is not given.
    EXPORT_SPARK_MASTER: str = "local[*]"
    #: Rows per Spark read partition when --partitions is not given.
    EXPORT_ROWS_PER_PARTITION: int = 250_000
    #: manage.py pgmsg_archive without arguments (run it from cron, docs/storage.md): event
    #: partitions that ended more than ARCHIVE_AFTER seconds ago go to Parquet under
    #: ARCHIVE_PATH (empty: the command needs --output).
    ARCHIVE_PATH: str = ""
    ARCHIVE_AFTER: float = 365 * 24 * 3600.0
    #: Seconds between periodic archive runs: workers serving subscriptions start
    #: pgmsg_archive (with ARCHIVE_PATH and ARCHIVE_AFTER) in a child process when a partition
    #: is due, one run at a time in the cluster. Unset (0): no periodic runs (use cron).
    ARCHIVE_INTERVAL: float = 0.0
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
    #: Outbox destinations by name: a broker URL (amqp://, nats://, redis://, mqtt://) or the
    #: dotted path of a Python callable. See docs/outbox.md.
    OUTBOX_DESTINATIONS: dict = dataclasses.field(default_factory=dict)
    #: Seconds a relay waits for a broker's confirmation before it counts the broker as down.
    OUTBOX_PUBLISH_TIMEOUT: float = 10.0
    #: An outbox is "degraded" when its oldest pending message is this many seconds old.
    OUTBOX_DEGRADED_AGE: float = 60.0


_KIND = {"bool": "a bool", "dict": "a dict", "bool | None": "True, False or None"}


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
            "bool | None": value is None or isinstance(value, bool),
            "dict": isinstance(value, dict),
        }[expected]
        if not ok:
            raise errors.ConfigurationError(
                f"PGMSG[{key!r}] must be "
                f"{_KIND.get(expected, 'a positive ' + expected)}, got {value!r}"
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
