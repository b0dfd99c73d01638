"""The listen worker: wait -> claim (SKIP LOCKED) -> handle -> ack | retry | dead-letter.

One loop serves every kind of stored message. A *source* (stored notifications here; inboxes
and subscriptions plug in the same way) claims a batch of its rows in a transaction, runs
each message's handlers under a savepoint, and acknowledges the batch in that same
transaction, so handler writes and acknowledgements commit together or not at all. A
dedicated autocommit connection LISTENs; NOTIFY only says "look", the rows are the truth, so
a missed NOTIFY is covered by the periodic sweep.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import logging
import os
import random
import signal
import time
import traceback
from collections.abc import Iterable
from typing import Protocol

import psycopg
from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction
from psycopg import sql as pgsql

from pgmsg import channels, conf, errors, payloads, sql, triggers

logger = logging.getLogger(__name__)

_SQL = sql.load("notifications.sql")

_CONNECTION_ERRORS = (OperationalError, InterfaceError, DatabaseError, psycopg.Error)
# A lost connection shows as InterfaceError, or OperationalError with the connection closed.
_CONNECTION_ERRORS_STRICT = (InterfaceError, psycopg.InterfaceError)
_MAX_ERROR_CHARS = 4000


@dataclasses.dataclass(frozen=True)
class Delivery:
    """The message being handled, as seen from inside a listener (see current_delivery())."""

    #: What kind of row: "notification", "inbox", "event", ...
    kind: str
    id: int | str
    #: The channel, inbox or subscription name.
    name: str
    #: Failed attempts before this one (0 on the first delivery).
    attempts: int


_current: contextvars.ContextVar[Delivery | None] = contextvars.ContextVar(
    "pgmsg_delivery", default=None
)


def current_delivery() -> Delivery | None:
    """The delivery whose handlers are running now, or None outside a handler.

    Useful as an idempotency key for side effects outside the database, or to tell a
    first delivery from a retry.
    """
    return _current.get()


class Source(Protocol):
    """A table of stored messages that the worker drains."""

    #: Shown in logs.
    label: str

    def wants(self, wake_payload: str) -> bool:
        """Whether a NOTIFY on the wake channel with this payload concerns this source."""

    def process_batch(self, worker: Worker) -> int:
        """Claim up to ``worker.batch_size`` due messages, handle them, commit; return the count
        claimed. Must stop handling (leaving the rest unclaimed) once ``worker.stopping``."""

    def seconds_until_due(self, worker: Worker) -> float | None:
        """Seconds until the next delayed message is due; None if nothing waits."""


def retry_delay(attempts_before: int) -> float:
    """Exponential backoff with +-20 % jitter so retries of a failed batch spread out."""
    settings = conf.get()
    base = min(settings.RETRY_BACKOFF * 2**attempts_before, settings.RETRY_BACKOFF_MAX)
    return base * random.uniform(0.8, 1.2)


def describe_error(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    if len(text) > _MAX_ERROR_CHARS:
        text = text[: _MAX_ERROR_CHARS // 4] + "\n...\n" + text[-3 * _MAX_ERROR_CHARS // 4 :]
    return text


def failure_outcome(exc: Exception, attempts: int, max_attempts: int) -> tuple[bool, str]:
    """(give up now?, the error text to keep) for a message whose handlers raised ``exc`` on
    attempt ``attempts + 1``. A NotRetryable error gives up at once."""
    text = describe_error(exc)
    if isinstance(exc, errors.NotRetryable):
        return True, "not retried: this message cannot succeed on a retry\n" + text
    return attempts + 1 >= max_attempts, text


def run_batch(worker, rows, prepare, on_failure, *, group=None) -> list:
    """Run the handlers of claimed ``rows`` inside the caller's claim transaction.

    ``prepare(row)`` returns ``(delivery, handle, fail)``: ``handle()`` runs the row's handlers
    and ``fail(exc)`` builds the failure record passed to ``on_failure``. Returns the ids of
    the rows handled.

    Fast path: the whole batch runs under one savepoint. If any handler raises, that savepoint
    is rolled back (undoing every write of the batch so far) and the batch is run again with a
    savepoint per message, so the failure is recorded and the other messages still commit.
    Savepoints cost a round trip each; paying them only for batches that saw a failure is what
    makes batching pay. The price: in such a batch, the handlers of the messages before the
    failing one run twice (their database writes are kept once). PGMSG["SAVEPOINT_PER_MESSAGE"]
    turns the fast path off.

    ``group(row)``, for ordered sources: after a failure, the later rows of the same group are
    not run (they stay claimed but unhandled, and are released or put back by the caller).
    """
    db = worker.database
    if not conf.get().SAVEPOINT_PER_MESSAGE:
        done = []
        try:
            with transaction.atomic(using=db):
                for row in rows:
                    if worker.stopping:
                        break  # unhandled rows stay pending; their locks go at commit
                    delivery, handle, _ = prepare(row)
                    token = _current.set(delivery)
                    try:
                        handle()
                    finally:
                        _current.reset(token)
                    done.append(delivery.id)
            return done
        except _CONNECTION_ERRORS_STRICT:
            raise
        except Exception:
            pass  # rolled back; run the batch again, one savepoint per message
    done = []
    blocked = set()
    for row in rows:
        if worker.stopping:
            break
        if group is not None and group(row) in blocked:
            continue
        delivery, handle, fail = prepare(row)
        token = _current.set(delivery)
        try:
            with transaction.atomic(using=db):
                handle()
        except Exception as exc:
            on_failure(fail(exc))
            if group is not None:
                blocked.add(group(row))
        else:
            done.append(delivery.id)
        finally:
            _current.reset(token)
    return done


class NotificationSource:
    """Stored notifications of the exactly-once channels that have listeners here."""

    label = "notifications"

    def __init__(self, names: Iterable[str]) -> None:
        self.names = sorted(names)
        self._listeners = {name: list(channels.registry.listeners[name]) for name in self.names}
        self._specs = {name: channels.registry.get(name) for name in self.names}

    def wants(self, wake_payload: str) -> bool:
        return wake_payload in self._listeners

    def process_batch(self, worker: Worker) -> int:
        db = worker.database
        failures: dict[int, tuple[str, float, bool]] = {}
        with transaction.atomic(using=db):
            with connections[db].cursor() as cursor:
                cursor.execute(
                    _SQL["claim_notifications"],
                    {"channels": self.names, "limit": worker.batch_size},
                )
                rows = sorted(cursor.fetchall())
                done = set(
                    run_batch(
                        worker, rows, self._prepare, lambda f: failures.__setitem__(f[0], f[1:])
                    )
                )
                left = [row for row in rows if row[0] not in done]
                if left:
                    cursor.execute(_SQL["restore_notifications"], _restore_params(left, failures))
        worker.handled += len(done)
        return len(rows)

    def _prepare(self, row):
        id_, channel, text, attempts = row[:4]
        return (
            Delivery("notification", id_, channel, attempts),
            lambda: self._handle(channel, text),
            lambda exc: self._failure(id_, channel, attempts, exc),
        )

    def _handle(self, channel: str, text: str) -> None:
        spec = self._specs[channel]
        if spec.is_trigger:
            message = triggers.decode_row_change(spec.model, text)
        else:
            try:
                data = json.loads(text)
            except ValueError as exc:
                raise errors.PayloadError(f"payload is not JSON: {exc}") from exc
            message = payloads.load(spec.payload_class, data)
        for func in self._listeners[channel]:
            func(message)

    def _failure(self, id_: int, channel: str, attempts: int, exc: Exception):
        spec = self._specs[channel]
        dead, text = failure_outcome(exc, attempts, spec.max_attempts or conf.get().MAX_ATTEMPTS)
        logger.warning(
            "pgmsg: notification %s on %r failed (attempt %s%s): %s",
            id_,
            channel,
            attempts + 1,
            ", now dead" if dead else "",
            exc,
        )
        return id_, text, 0.0 if dead else retry_delay(attempts), dead

    def seconds_until_due(self, worker: Worker) -> float | None:
        with connections[worker.database].cursor() as cursor:
            cursor.execute(_SQL["seconds_until_due"], {"channels": self.names})
            return cursor.fetchone()[0]


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """What a worker was asked to serve, handed to each feature's ``worker_sources()``."""

    #: Nothing was named: serve every inbox / subscription that has handlers.
    serve_all: bool
    #: Names given with --inbox / --subscription (None when not given).
    inboxes: list[str] | None
    subscriptions: list[str] | None
    #: (i, N): take only share i of N (static partitioning), or None for all.
    partition: tuple[int, int] | None


#: Modules that contribute sources to every worker through ``worker_sources(options)``.
#: A module that is not there (a feature not installed) is skipped.
SOURCE_MODULES = ["pgmsg.inbox", "pgmsg.subscriptions"]


def _source_module(name: str):
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        return _NoSources


class _NoSources:
    @staticmethod
    def worker_sources(options: SourceOptions) -> list:
        return []


def _restore_params(rows: list[tuple], failures: dict[int, tuple[str, float, bool]]) -> dict:
    columns = list(zip(*rows))
    no_failure = (None, None, False)
    extra = [failures.get(row[0], no_failure) for row in rows]
    return {
        "ids": list(columns[0]),
        "channels": list(columns[1]),
        "payloads": list(columns[2]),
        "attempts": list(columns[3]),
        "available_at": list(columns[4]),
        "created_at": list(columns[5]),
        "errors": [f[0] if f[0] is not None else row[6] for f, row in zip(extra, rows)],
        "failed_at": list(columns[7]),
        "delays": [f[1] for f in extra],
        "dead": [f[2] for f in extra],
    }


class Worker:
    """Runs sources until stopped. ``manage.py listen`` builds one per process."""

    def __init__(
        self,
        *,
        channel_names: Iterable[str] | None = None,
        inboxes: Iterable[str] | None = None,
        subscriptions: Iterable[str] | None = None,
        partition: tuple[int, int] | None = None,
        sources: Iterable[Source] = (),
        batch_size: int | None = None,
        until_idle: bool = False,
        install_signal_handlers: bool = True,
    ) -> None:
        settings = conf.get()
        self.database = settings.DATABASE
        self.batch_size = batch_size or settings.BATCH_SIZE
        self.until_idle = until_idle
        self.install_signal_handlers = install_signal_handlers
        self.stopping = False
        self.handled = 0
        self._listen_conn: psycopg.Connection | None = None

        # Naming any channel, inbox or subscription serves only what is named; naming nothing
        # serves everything that has a handler.
        named = channel_names is not None or inboxes is not None or subscriptions is not None
        options = SourceOptions(
            serve_all=not named and not sources,
            inboxes=None if inboxes is None else list(inboxes),
            subscriptions=None if subscriptions is None else list(subscriptions),
            partition=partition,
        )
        if channel_names is None and named:
            channel_names = []
        if channel_names is None and sources:
            channel_names = []
        stored, self.broadcast = _split_channels(channel_names)
        self.sources: list[Source] = list(sources)
        if stored:
            self.sources.insert(0, NotificationSource(stored))
        for module_name in SOURCE_MODULES:
            self.sources.extend(_source_module(module_name).worker_sources(options))
        if not self.sources and not self.broadcast:
            raise errors.ConfigurationError(
                "nothing to listen to: no listener or handler is registered for what was named "
                "(or at all); define listeners in an app's listeners.py with @pgmsg.listener(...)"
            )

    # -- running -----------------------------------------------------------------------------

    def run(self) -> None:
        previous = self._install_signal_handlers() if self.install_signal_handlers else {}
        try:
            self._run()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _run(self) -> None:
        logger.info(
            "pgmsg worker %s: sources %s, broadcast %s",
            os.getpid(),
            [s.label for s in self.sources],
            sorted(self.broadcast),
        )
        reconnect_delay = 0.5
        while not self.stopping:
            try:
                self._connect_listener()
                self._loop()
                reconnect_delay = 0.5
            except _CONNECTION_ERRORS as exc:
                if self.stopping:
                    break
                if self.until_idle:
                    raise  # a one-shot run reports the error instead of waiting it out
                # Lost connections, a restarting server, a migration not applied yet: the rows
                # are safe in the database, so wait and carry on.
                logger.warning(
                    "pgmsg worker %s: database error, reconnecting in %.1fs: %s",
                    os.getpid(),
                    reconnect_delay,
                    exc,
                )
                self._close()
                self._sleep(reconnect_delay)
                reconnect_delay = min(reconnect_delay * 2, conf.get().RECONNECT_BACKOFF_MAX)
            else:
                break
        self._close()
        logger.info("pgmsg worker %s: stopped after handling %s", os.getpid(), self.handled)

    def stop(self) -> None:
        """Finish the message in hand, commit, and return from run()."""
        self.stopping = True

    def _loop(self) -> None:
        # Start-up sweep: rows stored while no worker ran are due now.
        dirty = set(range(len(self.sources)))
        sweep_interval = conf.get().SWEEP_INTERVAL
        next_sweep = time.monotonic() + sweep_interval
        while not self.stopping:
            for index in sorted(dirty):
                if self.stopping:
                    return
                if self.sources[index].process_batch(self) < self.batch_size:
                    dirty.discard(index)
            if dirty:
                continue
            if self.until_idle:
                return
            timeout = next_sweep - time.monotonic()
            for source in self.sources:
                due = source.seconds_until_due(self)
                if due is not None:
                    timeout = min(timeout, max(due, 0.0))
            for payload, channel in self._wait(max(timeout, 0.0)):
                if channel == channels.WAKE_CHANNEL:
                    dirty.update(i for i, s in enumerate(self.sources) if s.wants(payload))
                else:
                    self._handle_broadcast(channel, payload)
            if time.monotonic() >= next_sweep or timeout <= 0:
                dirty.update(range(len(self.sources)))
                next_sweep = time.monotonic() + sweep_interval

    def _wait(self, timeout: float) -> list[tuple[str, str]]:
        # Short slices keep a stop request (signal) from waiting out a long sweep interval.
        deadline = time.monotonic() + timeout
        while not self.stopping:
            slice_ = min(0.25, max(deadline - time.monotonic(), 0.0))
            got = [
                (n.payload, n.channel)
                for n in self._listen_conn.notifies(timeout=slice_, stop_after=1)
            ]
            if got or time.monotonic() >= deadline:
                return got
        return []

    # -- broadcast ---------------------------------------------------------------------------

    def _handle_broadcast(self, notify_channel: str, text: str) -> None:
        name = notify_channel.removeprefix(channels.BROADCAST_PREFIX)
        spec = channels.registry.get(name)
        try:
            message = payloads.load(spec.payload_class, json.loads(text))
        except (ValueError, errors.PayloadError) as exc:
            logger.error("pgmsg: broadcast on %r has a bad payload, dropped: %s", name, exc)
            return
        for func in channels.registry.listeners.get(name, []):
            try:
                with transaction.atomic(using=self.database):
                    func(message)
            except _CONNECTION_ERRORS:
                raise
            except Exception:
                logger.exception("pgmsg: broadcast listener %r on %r failed", func, name)

    # -- connections and signals -------------------------------------------------------------

    def _connect_listener(self) -> None:
        if self._listen_conn is not None and not self._listen_conn.closed:
            return
        params = connections[self.database].get_connection_params()
        for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
            params.pop(key, None)
        conn = psycopg.connect(**params, autocommit=True)
        names = [channels.WAKE_CHANNEL] + [
            channels.BROADCAST_PREFIX + name for name in sorted(self.broadcast)
        ]
        for name in names:
            conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(name)))
        self._listen_conn = conn

    def _close(self) -> None:
        if self._listen_conn is not None:
            try:
                self._listen_conn.close()
            except psycopg.Error:
                pass
            self._listen_conn = None
        try:
            connections[self.database].close()
        except DatabaseError:
            pass

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(min(0.1, deadline - time.monotonic()))

    def _install_signal_handlers(self) -> dict:
        def handler(signum, frame):
            if self.stopping:
                logger.warning("pgmsg worker %s: second signal, exiting at once", os.getpid())
                os._exit(128 + signum)
            logger.info(
                "pgmsg worker %s: signal %s, finishing the message in hand", os.getpid(), signum
            )
            self.stop()

        return {
            signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)
        }


def _split_channels(names: Iterable[str] | None) -> tuple[set[str], set[str]]:
    """Channels to serve, as (exactly-once, broadcast); names given must be known and listened."""
    registry = channels.registry
    if names is None:
        wanted = {name for name, funcs in registry.listeners.items() if funcs}
    else:
        wanted = set()
        for name in names:
            registry.get(name)  # raises UnknownChannel with the known names
            if not registry.listeners.get(name):
                raise errors.ConfigurationError(f"channel {name!r} has no listener registered")
            wanted.add(name)
    for name in wanted:
        registry.get(name)
    stored = {n for n in wanted if registry.get(n).delivery == channels.EXACTLY_ONCE}
    return stored, wanted - stored
