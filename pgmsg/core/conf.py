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
    #: Send the producers' statements (notify(), publish(), receive(), append()), and the
    #: worker's first and last statements of each batch, through Django's cursor wrapper even
    #: when no execute wrapper is installed and queries are not logged: for instrumentation
    #: that patches Django's cursor class (some APM agents). Off, they go to libpq or
    #: psycopg's cursor of the same connection, in the same transaction (core/wire/,
    #: docs/wire.md).
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
    #: Seconds without an answer from PostgreSQL after which a worker counts a connection of
    #: its own as lost (a silent network partition: no FIN, no RST) and reconnects: libpq
    #: keepalives, tcp_user_timeout and connect_timeout on the worker's connections (Django's,
    #: under what its OPTIONS set, and its LISTEN connection). See core/keepalive.py.
    CONNECTION_DEAD_AFTER: float = 30.0
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
    #: Outbox destinations by name: a broker URL (amqp://, nats://, redis://, mqtt://), a
    #: webhook URL (https://, http://) or the dotted path of a Python callable. See
    #: docs/outbox.md.
    OUTBOX_DESTINATIONS: dict = dataclasses.field(default_factory=dict)
    #: The signing secret of each HTTP(S) outbox destination, by destination name (HMAC-SHA256,
    #: docs/bridges.md); a URL's ``secret=`` option overrides it.
    OUTBOX_HTTP_SECRETS: dict = dataclasses.field(default_factory=dict)
    #: Seconds a relay waits for a broker's confirmation before it counts the broker as down.
    OUTBOX_PUBLISH_TIMEOUT: float = 10.0
    #: An outbox is "degraded" when its oldest pending message is this many seconds old.
    OUTBOX_DEGRADED_AGE: float = 60.0
    #: Webhook receivers of the inbox by name (pgmsg.urls' ``webhooks/<name>/``): each a dict
    #: with the inbox, the secret(s), the signature format and headers, the timestamp
    #: tolerance, the body limit and where the message id, type, aggregate id and trace id come
    #: from. See docs/bridges.md.
    WEBHOOKS: dict = dataclasses.field(default_factory=dict)
    #: Bridges from brokers into inboxes, by name: {"url": ..., "topic": ..., "inbox": ...,
    #: and the mapping}. Run by ``manage.py listen`` (``--bridge NAME``). See docs/bridges.md.
    INBOX_BRIDGES: dict = dataclasses.field(default_factory=dict)
    #: A bearer token that opens pgmsg.urls' names, counts and metrics to a client without a
    #: login (``Authorization: Bearer <token>``: a Prometheus scraping /pgmsg/metrics/). Empty
    #: (the default): only logged-in users with pgmsg.view_overview; others get the status.
    ENDPOINT_TOKEN: str = ""
    #: The live endpoint (pgmsg.live, docs/live.md): seconds of silence after which a client
    #: gets a heartbeat (an SSE comment line), so proxies and browsers keep the stream open.
    LIVE_HEARTBEAT: float = 15.0
    #: Events held for one live client that is not reading fast enough; one more and it is
    #: disconnected with a retry hint, to resume from the store (memory stays bounded).
    LIVE_CLIENT_BUFFER: int = 1000
    #: The largest SSE message (bytes) the live endpoint sends for one event; a larger event
    #: is replaced by a "pgmsg-skipped" message that names it and says why.
    LIVE_MAX_EVENT_BYTES: int = 65536
    #: Seconds a browser waits before reconnecting (SSE's retry: field) after a disconnect.
    LIVE_RETRY: float = 2.0


_KIND = {"bool": "a bool", "dict": "a dict", "bool | None": "True, False or None"}


def _number_kind(field: dataclasses.Field) -> str:
    return f"a {'non-negative' if field.default == 0 else 'positive'} {field.type}"


def _check_types(values: dict) -> Settings:
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise errors.ConfigurationError(
            f"Unknown PGMSG setting(s) {unknown}; known settings are {sorted(fields)}"
        )
    for key, value in values.items():
        expected = fields[key].type
        # A number whose default is 0 means "off" at 0 (ARCHIVE_INTERVAL): 0 may be set too.
        least = 0 if fields[key].default == 0 else 1e-300
        number = not isinstance(value, bool) and isinstance(value, int | float) and value >= least
        ok = {
            "str": isinstance(value, str),
            "int": number and isinstance(value, int),
            "float": number,
            "bool": isinstance(value, bool),
            "bool | None": value is None or isinstance(value, bool),
            "dict": isinstance(value, dict),
        }[expected]
        if not ok:
            raise errors.ConfigurationError(
                f"PGMSG[{key!r}] must be "
                f"{_KIND.get(expected, _number_kind(fields[key]))}, got {value!r}"
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
