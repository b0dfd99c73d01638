"""The live hub: one per server process, it follows the store and fans out to every client.

Two PostgreSQL connections for the whole process, whatever the number of browsers: one
LISTENs (the workers' wake channel, core/wake.py, and the broadcast channels mounted), one
reads. A wake-up only says "look": the hub then reads every new event from the store in its
gap-free read order (transaction id, position) below the read horizon, and offers each one to
the clients that want it. A NOTIFY that never comes (a lost connection, a producer that
appended while the hub was busy) costs latency, never an event: the hub looks again after
every read that found something, at the sweep, and after it reconnects, from where it stood.

Producers NOTIFY only while the hub is declared idle, exactly as for a subscription worker
(docs/wakeups.md): the hub lingers a few milliseconds after each event it finds (IDLE_AFTER)
and declares itself idle for "events" (every category) only when none came, so a steady
stream of appends is read by polling and costs its producers no NOTIFY.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time

import psycopg
from psycopg import sql as pgsql

import pgmsg.live.clients as clients
import pgmsg.live.connections as connections
import pgmsg.live.frames as frames
import pgmsg.live.reads as reads
from pgmsg.channels import declarations
from pgmsg.core import conf, wake
from pgmsg.live.asks import Ask
from pgmsg.live.clients import Client

logger = logging.getLogger(__name__)

#: The wake payload that every append wakes (its "scope"): the hub follows every category.
WAKE_PAYLOADS = ["events"]

#: How long a notifies() wait lasts before the listener looks for channels to LISTEN to.
LISTEN_POLL = 0.25

#: First and longest pause while events are committed above the read horizon (a transaction
#: that appends nothing holds it back, and its end wakes nobody).
HORIZON_POLL_FIRST = 0.005
HORIZON_POLL_MAX = 0.5

#: Broadcast channels (their NOTIFY channel names) that some mounted view serves.
wanted_channels: set[str] = set()


class Unavailable(Exception):
    """The hub has no working connection to PostgreSQL right now."""


class Hub:
    """The process's hub (``Hub.get()``); clients join it through ``catch_up`` or ``join``."""

    _instances: dict[asyncio.AbstractEventLoop, Hub] = {}

    @classmethod
    def get(cls) -> Hub:
        """The hub of the running event loop, started on first use (once closed, it stays
        closed: the server is shutting down, and new clients are answered 503)."""
        loop = asyncio.get_running_loop()
        hub = cls._instances.get(loop)
        if hub is None:
            hub = cls._instances[loop] = cls()
            hub.start()
        return hub

    def __init__(self) -> None:
        #: Clients in step with the hub: offered each new event they want.
        self.clients: set[Client] = set()
        #: Clients of broadcast channels, by NOTIFY channel name.
        self.channel_clients: dict[str, set[Client]] = {}
        self.listening: set[str] = set()
        self.read_lock = asyncio.Lock()
        #: Every event below this transaction id has been read and offered (None: not yet
        #: known), and ``checkpoint`` is the read-order key of the last one (or the key that
        #: sorts after all of them).
        self.horizon: int | None = None
        self.checkpoint: tuple[int, int] = (0, 0)
        self.connected = asyncio.Event()
        self.closed = False
        self._wake = asyncio.Event()
        self._lost = asyncio.Event()
        self._listen_conn: psycopg.AsyncConnection | None = None
        self._read_conn: psycopg.AsyncConnection | None = None
        self._idle_held = False
        self._idle_settled = False
        self._task: asyncio.Task | None = None
        self._beats: asyncio.Task | None = None
        self._listener: asyncio.Task | None = None

    # -- life ------------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="pgmsg live hub")
        self._beats = loop.create_task(self._heartbeats(), name="pgmsg live heartbeats")
        self._chain_stop_signals()

    async def _heartbeats(self) -> None:
        """Every LIVE_HEARTBEAT seconds, a comment line to each client sent nothing since the
        last tick: one timer for the process, not one per client and message."""
        while not self.closed:
            await asyncio.sleep(conf.get().LIVE_HEARTBEAT)
            for client in [*self.clients, *(c for s in self.channel_clients.values() for c in s)]:
                client.beat()

    def close(self, reason: str = clients.SHUTDOWN) -> None:
        """End every client's stream with ``reason`` and a retry hint, and stop the hub."""
        if self.closed:
            return
        self.closed = True
        for client in [*self.clients, *(c for s in self.channel_clients.values() for c in s)]:
            client.end(reason)
        self.clients.clear()
        self.channel_clients.clear()
        self._lost.set()
        self.connected.set()  # wake anyone waiting to join: they see ``closed``

    def _chain_stop_signals(self) -> None:
        """End the streams on SIGTERM / SIGINT before the server's own handler runs: ASGI
        servers wait for open responses to finish before they exit, and an SSE stream does not
        finish by itself."""
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(signum)

            def handler(number, frame, previous=previous):
                loop.call_soon_threadsafe(self.close)
                if callable(previous):
                    previous(number, frame)
                elif previous == signal.SIG_DFL:
                    signal.signal(number, signal.SIG_DFL)
                    signal.raise_signal(number)

            signal.signal(signum, handler)

    async def ready(self, timeout: float) -> None:
        """Wait until the hub is connected; Unavailable after ``timeout`` seconds."""
        if self.closed:
            raise Unavailable("the server is shutting down")
        try:
            async with asyncio.timeout(timeout):
                await self.connected.wait()
        except TimeoutError:
            raise Unavailable("PostgreSQL is unreachable; the hub keeps trying") from None
        if self.closed:
            raise Unavailable("the server is shutting down")

    def lost(self) -> None:
        """A connection failed (seen by the hub or by a client's read): reconnect."""
        self.connected.clear()
        self._lost.set()

    async def _run(self) -> None:
        backoff = 0.05
        while not self.closed:
            try:
                await self._connect()
                backoff = 0.05
                await self._serve()
            except (psycopg.Error, OSError) as exc:
                if not self.closed:
                    logger.warning(
                        "pgmsg live: connection to PostgreSQL lost (%s); reconnecting", exc
                    )
            except Exception:
                logger.exception("pgmsg live: the hub failed; restarting it")
            finally:
                await self._disconnect()
            if not self.closed:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, conf.get().RECONNECT_BACKOFF_MAX)

    async def _connect(self) -> None:
        self._lost.clear()
        self._listen_conn = await connections.open_connection()
        for name in [wake.WAKE_CHANNEL, *sorted(wanted_channels)]:
            await self._listen(name)
        self._read_conn = await connections.open_connection()
        if self.horizon is None:  # first start: follow from now
            self.horizon = await reads.read_horizon(self._read_conn)
            self.checkpoint = (self.horizon - 1, reads.LAST_POSITION)
        self._listener = asyncio.get_running_loop().create_task(self._listen_loop())
        self.connected.set()

    async def _listen(self, name: str) -> None:
        await self._listen_conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(name)))
        self.listening.add(name)

    async def _disconnect(self) -> None:
        self.connected.clear()
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(BaseException):
                await self._listener
            self._listener = None
        for conn in (self._listen_conn, self._read_conn):
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
        self._listen_conn = self._read_conn = None
        self._idle_held = self._idle_settled = False  # the idle locks went with the session
        self.listening.clear()

    # -- waking ----------------------------------------------------------------------------

    async def _listen_loop(self) -> None:
        """Receive NOTIFYs: a wake-up for the reader, or a broadcast to fan out at once."""
        try:
            while not self.closed:
                async for note in self._listen_conn.notifies(timeout=LISTEN_POLL):
                    if note.channel == wake.WAKE_CHANNEL:
                        if note.payload.startswith("events"):
                            self._wake.set()
                    else:
                        self._broadcast(note.channel, note.payload)
                for name in wanted_channels - self.listening:
                    await self._listen(name)
        except (psycopg.Error, OSError) as exc:
            if not self.closed:
                logger.warning("pgmsg live: LISTEN connection lost (%s)", exc)
            self.lost()

    async def _sleep(self, timeout: float) -> None:
        """Until a wake-up, a lost connection, or ``timeout`` seconds."""
        if timeout > 0 and not self._wake.is_set():
            waiters = [
                asyncio.ensure_future(self._wake.wait()),
                asyncio.ensure_future(self._lost.wait()),
            ]
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()
        self._wake.clear()
        if self._lost.is_set():
            raise Unavailable("connection lost")

    # -- reading and fanning out -----------------------------------------------------------

    async def _serve(self) -> None:
        settings = conf.get()
        last_found = -1e9
        linger = wake.LINGER_POLL
        horizon_poll = HORIZON_POLL_FIRST
        try:
            while not self.closed:
                found, waiting = await self._read_new()
                now = time.monotonic()
                if found:
                    if self._idle_held and now - last_found < settings.IDLE_AFTER:
                        await reads.withdraw(self._read_conn, WAKE_PAYLOADS)
                        self._idle_held = self._idle_settled = False
                    last_found, linger = now, wake.LINGER_POLL
                    continue  # look again at once: more may have come meanwhile
                if waiting:  # committed events wait for the horizon to move
                    await self._sleep(horizon_poll)
                    horizon_poll = min(horizon_poll * 2, HORIZON_POLL_MAX)
                    continue
                horizon_poll = HORIZON_POLL_FIRST
                if not self._idle_held and now - last_found < settings.IDLE_AFTER:
                    await self._sleep(max(min(linger, settings.IDLE_AFTER - (now - last_found)), 0))
                    linger *= 2
                    continue
                if not self._idle_settled:
                    passed = await reads.declare_idle(
                        self._read_conn, WAKE_PAYLOADS, held=self._idle_held
                    )
                    self._idle_held = True
                    if passed:
                        self._idle_settled = True
                    else:
                        await self._sleep(wake.POLL_FIRST)
                    continue  # after the barrier passed: one more look before sleeping
                await self._sleep(settings.SWEEP_INTERVAL)
        except Unavailable:
            if not self.closed:
                raise psycopg.OperationalError("a connection of the live hub was lost") from None

    async def _read_new(self) -> tuple[int, bool]:
        """Read and offer every event below a fresh horizon; how many, and whether committed
        events are waiting above it."""
        found = 0
        async with self.read_lock:
            below = max(await reads.read_horizon(self._read_conn), self.horizon)
            while True:
                rows = await reads.read_after(
                    self._read_conn, self.checkpoint, below=below, ask=None
                )
                if rows:
                    self.checkpoint = (int(rows[-1][1]), rows[-1][0])
                    self._fan_out(rows)
                    found += len(rows)
                if len(rows) < reads.PAGE:
                    break
                await asyncio.sleep(0)  # the clients' streams take the page before the next
            self.horizon = below
            waiting = await reads.above_horizon(self._read_conn, below)
        return found, waiting

    def _fan_out(self, rows: list[tuple]) -> None:
        max_bytes = conf.get().LIVE_MAX_EVENT_BYTES
        members = list(self.clients)
        for row in rows:
            position, xid, stream, category, _version, type_ = row[:6]
            key = (int(xid), position)
            message = None
            for client in members:
                if not client.ask.wants(stream, category, type_):
                    continue
                if client.checkpoint is not None:
                    if key <= client.checkpoint:
                        continue  # it has this one already (it resumed from ahead of the hub)
                    client.checkpoint = None
                if message is None:
                    message = frames.event_message(row, max_bytes=max_bytes)
                if not client.offer(message):
                    self.clients.discard(client)

    def _broadcast(self, channel: str, payload: str) -> None:
        members = self.channel_clients.get(channel)
        if not members:
            return
        message = frames.message(payload)
        for client in list(members):
            if not client.offer(message):
                members.discard(client)

    # -- clients ---------------------------------------------------------------------------

    async def catch_up(self, client: Client):
        """Yield chunks of the events ``client`` missed (from its checkpoint), read from the
        store a page at a time, until it is in step: then it joins the live clients, to be
        offered every later event. A lost connection raises Unavailable (try again)."""
        while True:
            if self.closed:
                raise Unavailable("the server is shutting down")
            async with self.read_lock:
                if not self.connected.is_set():
                    raise Unavailable("PostgreSQL is unreachable")
                try:
                    rows = await reads.read_after(
                        self._read_conn, client.checkpoint, below=self.horizon, ask=client.ask
                    )
                except (psycopg.Error, OSError) as exc:
                    self.lost()
                    raise Unavailable(str(exc)) from None
                if rows:
                    client.checkpoint = (int(rows[-1][1]), rows[-1][0])
                in_step = len(rows) < reads.PAGE
                if in_step:
                    self.clients.add(client)
            if rows:
                max_bytes = conf.get().LIVE_MAX_EVENT_BYTES
                yield b"".join(frames.event_message(row, max_bytes=max_bytes) for row in rows)
            if in_step:
                return

    def join(self, client: Client) -> None:
        """A client that starts now (no Last-Event-ID), or a channel's."""
        if client.ask.channel is not None:
            self.channel_clients.setdefault(notify_channel(client.ask), set()).add(client)
        else:
            client.checkpoint = None
            self.clients.add(client)

    def leave(self, client: Client) -> None:
        self.clients.discard(client)
        if client.ask.channel is not None:
            self.channel_clients.get(notify_channel(client.ask), set()).discard(client)

    async def query(self, read, *args):
        """Run ``read(connection, *args)`` (reads.py) on the hub's reading connection."""
        async with self.read_lock:
            if not self.connected.is_set() or self._read_conn is None:
                raise Unavailable("PostgreSQL is unreachable")
            try:
                return await read(self._read_conn, *args)
            except (psycopg.Error, OSError) as exc:
                self.lost()
                raise Unavailable(str(exc)) from None


def notify_channel(ask: Ask) -> str:
    """The NOTIFY channel of a broadcast channel's client (channels/declarations.py)."""
    return declarations.BROADCAST_PREFIX + ask.channel
