"""The listen worker: wait -> claim (SKIP LOCKED) -> handle -> ack | retry | dead-letter.

One loop serves every kind of stored message. A *source* (see ``sources.py``) claims a batch
of its rows in a transaction, runs their handlers through ``batch.run_batch``, and
acknowledges the batch in that same transaction, so handler writes and acknowledgements commit
together or not at all. A dedicated autocommit connection LISTENs; NOTIFY only says "look",
the rows are the truth, so a missed NOTIFY is covered by the periodic sweep.
"""

from __future__ import annotations

import logging
import math
import os
import select
import signal
import time
from collections.abc import Iterable

import psycopg
from django.db import DatabaseError, InterfaceError, OperationalError, connections
from psycopg import sql as pgsql

from pgmsg.core import (
    batch,
    claims,
    conf,
    errors,
    instruments,
    keepalive,
    signals,
    sql,
    throughput,
    wake,
    young_generation,
)
from pgmsg.core import sources as sources_module

logger = logging.getLogger(__name__)

#: First pause before reconnecting; doubles up to RECONNECT_BACKOFF_MAX while it keeps failing.
RECONNECT_DELAY = 0.5

CONNECTION_ERRORS = (OperationalError, InterfaceError, DatabaseError, psycopg.Error)


QUERIES = sql.load(__package__, "worker.sql")


def session_settings() -> dict[str, str]:
    """WORKER_IDLE_TIMEOUT as the session settings: idle in transaction and unacknowledged
    data (ms), and keepalive probes that give up on a silent peer within about that time."""
    timeout = conf.get().WORKER_IDLE_TIMEOUT
    probe = max(1, int(timeout / 6))
    return {
        "idle": str(max(1, int(timeout * 1000))),
        "keepalive_idle": str(max(1, int(timeout / 2))),
        "keepalive_interval": str(probe),
    }


def linger_pause(since_work: float, idle_after: float, poll: float) -> float:
    """The pause before the next look while a worker lingers (PGMSG IDLE_AFTER): ``poll``,
    but never past IDLE_AFTER, so the worker declares itself idle when IDLE_AFTER runs out,
    not up to one (doubled) pause later. A producer that commits after that must find it
    declared: with pauses of 1, 2, 4, 8 ms the last look had come at 15 ms, and messages sent
    20 ms apart found the worker still undeclared about one time in twenty (no NOTIFY; found
    by its next look, 1 to 2 ms late)."""
    return max(min(poll, idle_after - since_work), 0.0)


def wait_readable(fd: int, timeout: float) -> None:
    """Block until ``fd`` has data to read or ``timeout`` seconds have passed.

    Not psycopg's ``notifies(timeout=...)``: it polls in whole milliseconds rounded down and
    spins through the last fraction of each wait, so a worker lingering with pauses of 1 to 4
    ms kept a core busy (about 7 ms of CPU per event appended 20 ms apart, docs/decisions.md).
    select() waits to the microsecond; poll() (rounded up to the millisecond) past its limit."""
    if fd < SELECT_FD_LIMIT:
        select.select([fd], [], [], timeout)
    else:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll(math.ceil(timeout * 1000))


#: select()'s highest file descriptor plus one (FD_SETSIZE on Linux and macOS).
SELECT_FD_LIMIT = 1024


class _LoopState:
    """What the worker's loop carries from one round to the next."""

    __slots__ = ("dirty", "idle_after", "last_work", "linger_poll", "next_sweep", "sweep_interval")

    def __init__(self, source_count: int) -> None:
        settings = conf.get()
        #: Sources to claim from; all at start: rows stored while no worker ran are due now.
        self.dirty = set(range(source_count))
        self.sweep_interval = settings.SWEEP_INTERVAL
        self.next_sweep = time.monotonic() + self.sweep_interval
        self.idle_after = settings.IDLE_AFTER
        self.last_work = 0.0
        self.linger_poll = wake.LINGER_POLL


class Worker:
    """Runs sources until stopped. ``manage.py listen`` builds one per process."""

    def __init__(
        self,
        *,
        partition: tuple[int, int] | None = None,
        sources: Iterable[sources_module.Source] = (),
        batch_size: int | None = None,
        until_idle: bool = False,
        install_signal_handlers: bool = True,
        **selected: Iterable[str] | None,
    ) -> None:
        """``selected``: names per capability (``channel_names=``, ``inboxes=``,
        ``subscriptions=``, ...). Naming anything serves only what is named; naming nothing
        (and passing no ``sources``) serves everything that has a handler."""
        settings = conf.get()
        self.database = settings.DATABASE
        self.batch_size = batch_size or settings.BATCH_SIZE
        self.until_idle = until_idle
        self.install_signal_handlers = install_signal_handlers
        self.stopping = False
        #: Run the next batch with a savepoint per message (after a fast-path failure).
        self.careful = False
        #: The transaction id of the last batch whose claim was recorded (core/claims.py).
        self.last_claim: int | None = None
        #: The pgmsg_claim row of the last record, replaced by the next one (core/claims.py).
        self.claim_row: int | None = None
        #: A claim record whose answer is still to be read (core/claims.py).
        self.record_in_flight: claims.SentRecord | None = None
        self.handled = 0
        #: Counts of committed batches for pgmsg_throughput, written about once a second
        #: (None: each batch writes its own, in its transaction; see core/throughput.py).
        self.tally: throughput.Tally | None = None
        self._listen_conn: psycopg.Connection | None = None
        self._reconnect_delay = RECONNECT_DELAY

        unknown = sorted(set(selected) - set(sources_module.factories))
        if unknown:
            raise TypeError(
                f"Worker() got unknown selection(s) {unknown}; "
                f"known: {sorted(sources_module.factories)}"
            )
        given = {key: list(names) for key, names in selected.items() if names is not None}
        options = sources_module.SourceOptions(
            serve_all=not given and not sources, selected=given, partition=partition
        )
        self.sources: list[sources_module.Source] = [
            *sources_module.build(options),
            *sources,
        ]
        if not self.sources:
            raise errors.ConfigurationError(
                "nothing to listen to: no listener or handler is registered for what was named "
                "(or at all); define listeners in an app's listeners.py with @pgmsg.listener(...)"
            )
        #: While it sleeps, the worker declares itself idle for these wake payloads (on its
        #: Django connection); producers NOTIFY only then. See pgmsg/core/wake.py.
        self._idle = wake.IdleDeclaration(
            payload for source in self.sources for payload in getattr(source, "wake_payloads", ())
        )
        #: NOTIFY channel -> the source that takes its payloads (broadcast channels).
        self._notify_routes = {
            channel: source
            for source in self.sources
            for channel in getattr(source, "notify_channels", ())
        }

    # -- running -----------------------------------------------------------------------------

    def run(self) -> None:
        previous = self._install_signal_handlers() if self.install_signal_handlers else {}
        if self.install_signal_handlers and signals.received():
            logger.info("pgmsg worker %s: stop signal during start-up", os.getpid())
            self.stop()
        try:
            with (
                young_generation.young_generation_for(self.batch_size),
                keepalive.on(connections[self.database]),
            ):
                self._run()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _run(self) -> None:
        logger.info("pgmsg worker %s: sources %s", os.getpid(), [s.label for s in self.sources])
        self._reconnect_delay = RECONNECT_DELAY
        # Run inside a caller's transaction, a batch's counts commit with the caller's.
        if not connections[self.database].in_atomic_block:
            self.tally = throughput.Tally()
        while not self.stopping:
            try:
                self._connect_listener()
                self._configure_session()
                self._loop()
            except CONNECTION_ERRORS as exc:
                if self.stopping:
                    break
                if self.until_idle:
                    raise  # a one-shot run reports the error instead of waiting it out
                # Lost connections, a restarting server, a migration not applied yet: the rows
                # are safe in the database, so wait and carry on.
                message, error = "pgmsg worker %s: database error, reconnecting in %.1fs: %s", exc
                silence = keepalive.silence_in(exc)
                if silence is not None:  # the kernel's keepalives or tcp_user_timeout gave up
                    error = silence
                    message = (
                        "pgmsg worker %s: connection to PostgreSQL lost: no answer for "
                        f"{conf.get().CONNECTION_DEAD_AFTER:g} s (network partition?); "
                        "reconnecting in %.1fs: %s"
                    )
                logger.warning(
                    message,
                    os.getpid(),
                    self._reconnect_delay,
                    error,
                )
                instruments.reconnected()
                self._close()
                self._sleep(self._reconnect_delay)
                # Doubles while reconnecting keeps failing; _loop resets it once a round of
                # batches went through, so each new outage starts from the short pause.
                self._reconnect_delay = min(
                    self._reconnect_delay * 2, conf.get().RECONNECT_BACKOFF_MAX
                )
            else:
                break
        self._close()
        logger.info("pgmsg worker %s: stopped after handling %s", os.getpid(), self.handled)

    def stop(self) -> None:
        """Finish the message in hand, commit, and return from run()."""
        self.stopping = True

    def _loop(self) -> None:
        """Claim from the sources with work, then, with none left, declare idle and sleep until
        a wake-up, a sweep or a due source. Every step runs once per round of batches."""
        loop = _LoopState(len(self.sources))
        while not self.stopping:
            claimed = self._claim_round(loop)
            if self.stopping:
                return
            self._reconnect_delay = RECONNECT_DELAY  # the database answered: reconnected
            if claimed:
                self._found_work(loop)
            if loop.dirty:
                self._write_counts()  # at most once a second while busy
                continue
            if self.until_idle:
                self._write_counts(now=True)
                return
            self._write_counts()  # when due; a write not due yet shortens the sleep below
            # Work came moments ago: keep looking (after 1, 2, 4, ... ms) for IDLE_AFTER before
            # declaring idle, so that a steady stream of producers never has to NOTIFY.
            lingering = (
                not self._idle.declared and time.monotonic() - loop.last_work < loop.idle_after
            )
            if self._declare_idle(lingering):
                loop.dirty.update(range(len(self.sources)))
                continue
            timeout = self._sleep_time(loop, lingering)
            self._take_wakeups(loop, timeout)
            if lingering or time.monotonic() >= loop.next_sweep or timeout <= 0:
                loop.dirty.update(range(len(self.sources)))
                loop.next_sweep = time.monotonic() + loop.sweep_interval

    def _claim_round(self, loop: _LoopState) -> int:
        """One batch from each source marked dirty; a source stays dirty while its batches come
        back full. Returns how many rows were claimed (stops early when asked to stop)."""
        claimed = 0
        for index in sorted(loop.dirty):
            if self.stopping:
                break
            source = self.sources[index]
            count = self.process(source)
            instruments.claimed(source.label, count)
            claimed += count
            if count < self.batch_size:
                loop.dirty.discard(index)
        return claimed

    def _found_work(self, loop: _LoopState) -> None:
        # Wake-ups (pgmsg/core/wake.py): work found moments after other work, or a full
        # batch, is a stream: busy again, producers stop NOTIFYing. A message on its own,
        # found while idle, leaves the declaration as it is (its producers kept waking this
        # worker), so that the worker goes back to sleep at once: no withdrawal, lingering
        # looks, declaration and last look around every message that comes alone.
        stream = bool(loop.dirty) or time.monotonic() - loop.last_work < loop.idle_after
        loop.last_work, loop.linger_poll = time.monotonic(), wake.LINGER_POLL
        if self._idle.declared and (stream or not self._idle.settled):
            with connections[self.database].cursor() as cursor:
                self._idle.withdraw(cursor)

    def _declare_idle(self, lingering: bool) -> bool:
        """About to sleep: declare idle. Once the barrier passes, every table gets one more
        look (a producer that checked before the declaration has committed by then): True
        then. While producers are mid-transaction it is retried after a short pause instead."""
        connection = connections[self.database].connection
        if self._idle.declared and not self._idle.held_by(connection):
            self._idle.lost()  # a handler closed the connection: declare on the new one
        if lingering or self._idle.settled:
            return False
        with connections[self.database].cursor() as cursor:
            return bool(self._idle.declare(cursor))

    def _sleep_time(self, loop: _LoopState, lingering: bool) -> float:
        """Until the next sweep, lingering look, idle retry, due source or counts write."""
        timeout = loop.next_sweep - time.monotonic()
        if lingering:
            since_work = time.monotonic() - loop.last_work
            timeout = min(timeout, linger_pause(since_work, loop.idle_after, loop.linger_poll))
            loop.linger_poll *= 2
        elif not self._idle.settled:
            timeout = min(timeout, self._idle.poll_delay())
        for source in [] if lingering else self.sources:
            due = source.seconds_until_due(self)
            if due is not None:
                timeout = min(timeout, max(due, 0.0))
        counts_due = self.tally.seconds_until_flush() if self.tally is not None else None
        if counts_due is not None:
            timeout = min(timeout, counts_due)
        return timeout

    def _take_wakeups(self, loop: _LoopState, timeout: float) -> None:
        """Wait up to ``timeout`` for NOTIFYs: mark the sources a wake-up names, hand
        broadcast channels' payloads to their source."""
        for payload, channel in self._wait(max(timeout, 0.0)):
            if channel == wake.WAKE_CHANNEL:
                loop.dirty.update(i for i, s in enumerate(self.sources) if s.wants(payload))
            else:
                self._notify_routes[channel].on_notify(self, channel, payload)

    def withdraw_claim(self) -> None:
        claims.withdraw(self)

    def process(self, source: sources_module.Source) -> int:
        """``source.process_batch``, with the fallback of run_batch's fast path: a batch in
        which a handler failed was rolled back (batch.Redo); claim again with a savepoint per
        row, so the failure is recorded and the other rows commit."""
        try:
            return source.process_batch(self)
        except batch.Redo:  # its claim was withdrawn before the rollback (withdraw_claim)
            pass
        # Outside the except block: run there, every handler error of the careful pass would
        # chain the Redo (and the first failing message's error) as its __context__.
        self.careful = True
        try:
            return source.process_batch(self)
        finally:
            self.careful = False

    def _wait(self, timeout: float) -> list[tuple[str, str]]:
        # Short slices keep a stop request (signal) from waiting out a long sweep interval.
        conn = self._listen_conn
        deadline = time.monotonic() + timeout
        while True:
            # What has arrived, and what came in with a claim record's answer: no waiting.
            got = [(n.payload, n.channel) for n in conn.notifies(timeout=0)]
            left = deadline - time.monotonic()
            if got or left <= 0 or self.stopping:
                return got
            wait_readable(conn.fileno(), min(0.25, left))

    # -- connections and signals -------------------------------------------------------------

    def _connect_listener(self) -> None:
        if self._listen_conn is not None and not self._listen_conn.closed:
            return
        params = connections[self.database].get_connection_params()
        for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
            params.pop(key, None)
        conn = psycopg.connect(**params, autocommit=True)
        # Its writes (claims) need not wait for a WAL flush: a dying worker process does not
        # lose them, only a server crash could, which would forget a crash count at worst.
        conn.execute("SET synchronous_commit = off")
        conn.execute(QUERIES["configure_session"], session_settings())
        for name in [wake.WAKE_CHANNEL, *sorted(self._notify_routes)]:
            conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(name)))
        self._listen_conn = conn

    def _configure_session(self) -> None:
        """Bound how long a frozen or vanished worker can hold a batch (WORKER_IDLE_TIMEOUT)."""
        db = connections[self.database]
        if db.in_atomic_block:
            return  # run inside a caller's transaction: its session is the caller's
        with db.cursor() as cursor:
            cursor.execute(QUERIES["configure_session"], session_settings())

    def side_connection(self) -> psycopg.Connection | None:
        """The worker's autocommit connection (it also LISTENs): for writes that must commit
        apart from the batch transaction, e.g. claims (pgmsg/core/claims.py). None when the
        worker is not running (a source driven by hand, in a test): nothing to record then."""
        return self._listen_conn if self._listen_conn and not self._listen_conn.closed else None

    def _write_counts(self, *, now: bool = False) -> None:
        if self.tally is not None and self._listen_conn is not None:
            self.tally.flush(self._listen_conn, now=now)

    def _close(self) -> None:
        try:
            self._write_counts(now=True)
        except psycopg.Error as exc:  # kept in the tally: written after the reconnect
            logger.warning("pgmsg worker %s: throughput counts not written: %s", os.getpid(), exc)
        self._idle.lost()  # the idle locks live on the Django connection closed below
        for source in self.sources:
            close = getattr(source, "close", None)  # a source with connections of its own
            if close is not None:
                close()
        self.record_in_flight = None  # its answer goes with the side connection
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

        # A signal ignored on entry stays ignored: supervised children ignore SIGINT, since
        # Ctrl-C reaches the whole process group and the supervisor forwards a SIGTERM.
        return {
            signum: signal.signal(signum, handler)
            for signum in signals.STOP_SIGNALS
            if signal.getsignal(signum) is not signal.SIG_IGN
        }
