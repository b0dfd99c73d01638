"""Benchmark: the live endpoint (pgmsg.live) with many SSE clients on one server process.

One uvicorn process serves ``/live/events?category=livebench`` (pgmsg_tests' urls, the
documented PGMSG defaults); --clients connections, spread over --client-processes processes
of a small asyncio HTTP client, all follow that category while a producer process appends
--rate events a second (one per transaction, ``pgmsg_append``, the SQL function behind
``pgmsg.append()``) for --seconds. Each event's stream name is unique, so every client's
receive time can be matched to the producer's commit time (taken when the commit returned):

- commit-to-client latency, p50 and p99 over every delivery;
- the server's memory per client: its RSS with the clients connected minus its RSS with one,
  divided by the clients;
- the server's CPU (cores busy) while the events flow;
- its PostgreSQL connections (pg_stat_activity of the scratch database, apart from the
  bench's own), which must be 1-2 whatever the clients.

The raw ceiling, same run: one psycopg connection LISTENing while the producer NOTIFYs once
per transaction (commit-to-listener latency, one listener, no HTTP). Then the naive design,
one PostgreSQL connection LISTENing per browser, on a private embedded PostgreSQL with the
stock max_connections (100): connections are opened one per client until the server refuses
one, and that count is printed with the server's answer.

    python bench/live.py [--clients 1000] [--rate 20] [--seconds 20] [--client-processes 4]

Uses DATABASE_URL's server (or the embedded default) and a scratch database that it drops and
re-creates; the naive part uses .pgdata-live/ (the live tests' private server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402

SCRATCH_DB = "pgmsg_bench_live"
CATEGORY = "livebench"
PATH = f"/live/events?category={CATEGORY}"
PRODUCER = "bench live producer"
MONITOR = "bench live monitor"


# -- the clients ----------------------------------------------------------------------------


class _SseProtocol(asyncio.Protocol):
    """One SSE connection, as cheap as a client can be (the clients share the server's two
    cores): no HTTP parsing past the status line, only the stream names of the messages,
    recorded with their receive time."""

    MARK = b'"stream": "'

    def __init__(self, path: str, received: list, connected: list) -> None:
        self.path, self.received, self.connected = path, received, connected
        self.head = True
        self.tail = b""

    def connection_made(self, transport) -> None:
        request = f"GET {self.path} HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n"
        transport.write(request.encode())

    def data_received(self, data: bytes) -> None:
        now = time.time()
        data = self.tail + data
        if self.head:
            if b"\r\n\r\n" not in data:
                self.tail = data
                return
            head, data = data.split(b"\r\n\r\n", 1)
            assert b" 200 " in head.split(b"\r\n", 1)[0], head
            self.head = False
            self.connected.append(1)
        start = data.find(self.MARK)
        while start >= 0:
            end = data.find(b'"', start + len(self.MARK))
            if end < 0:
                break
            self.received.append((data[start + len(self.MARK) : end].decode(), now))
            start = data.find(self.MARK, end)
        # Keep what may be the start of a name cut by the packet's end.
        self.tail = data[start:] if start >= 0 else data[-len(self.MARK) :]


async def _client(port: int, received: list, connected: list, path: str = PATH) -> None:
    loop = asyncio.get_running_loop()
    await loop.create_connection(lambda: _SseProtocol(path, received, connected), "127.0.0.1", port)


def _client_process(port: int, count: int, ready, results, stop, path: str = PATH) -> None:
    async def main():
        received: list = []
        connected: list = []
        tasks = []
        for _ in range(count):
            tasks.append(asyncio.ensure_future(_client(port, received, connected, path)))
            await asyncio.sleep(0.002)  # no thundering herd on the listen backlog
        while len(connected) < count:
            failed = [t for t in tasks if t.done() and t.exception()]
            if failed:
                raise failed[0].exception()
            await asyncio.sleep(0.05)
        ready.put(count)
        while not stop.is_set():
            await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()
        results.put(received)

    asyncio.run(main())


# -- the producer ---------------------------------------------------------------------------

APPEND = "SELECT pgmsg_append(%s, %s, %s::text[], %s::text[], %s::text[], %s::uuid[], NULL)"


def _producer(url: str, rate: float, seconds: float, notify_too: bool, out) -> None:
    """Append ``rate`` events a second (one per transaction); the commit time of each stream.
    ``notify_too``: NOTIFY 'raw_live' with the stream name instead (the raw ceiling)."""
    commits = {}
    with psycopg.connect(url, autocommit=True, application_name=PRODUCER) as conn:
        start = time.monotonic()
        for i in range(int(rate * seconds)):
            due = start + i / rate
            time.sleep(max(0.0, due - time.monotonic()))
            stream = f"{CATEGORY}-{uuid.uuid4().hex[:12]}"
            if notify_too:
                conn.execute("SELECT pg_notify('raw_live', %s)", [stream])
            else:
                data = json.dumps({"n": i, "sleep": 0.0, "fail": False, "tag": ""})
                conn.execute(
                    APPEND, [stream, CATEGORY, ["test.step"], [data], ["{}"], [uuid.uuid4()]]
                )
            commits[stream] = time.time()
    out.put(commits)


def _raw_listener(url: str, ready, results, stop) -> None:
    received = []
    with psycopg.connect(url, autocommit=True, application_name=MONITOR) as conn:
        conn.execute("LISTEN raw_live")
        ready.put(1)
        while not stop.is_set():
            for note in conn.notifies(timeout=0.2):
                received.append((note.payload, time.time()))
    results.put(received)


def percentiles(latencies: list[float]) -> tuple[float, float]:
    ordered = sorted(latencies)
    return (
        statistics.median(ordered) * 1000,
        ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
    )


def raw_ceiling(url: str, rate: float, seconds: float) -> tuple[float, float]:
    ctx = multiprocessing.get_context("spawn")
    ready, results, commits, stop = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Event()
    listener = ctx.Process(target=_raw_listener, args=(url, ready, results, stop))
    listener.start()
    ready.get(timeout=60)
    producer = ctx.Process(target=_producer, args=(url, rate, seconds, True, commits))
    producer.start()
    committed = commits.get(timeout=seconds + 120)
    time.sleep(0.5)
    stop.set()
    received = results.get(timeout=60)
    producer.join()
    listener.join()
    return percentiles([t - committed[s] for s, t in received if s in committed])


# -- the server -----------------------------------------------------------------------------


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def start_server(url: str, port: int) -> subprocess.Popen:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "PGMSG_LOGICAL_DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
    }
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "pgmsg_tests.asgi:application",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
            "--backlog",
            "4096",
        ],
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("uvicorn did not start")


def bare_memory(url: str, clients: int, processes: int) -> float:
    """KB per client of the same server with a bare SSE view (no pgmsg: Django and uvicorn
    alone, pgmsg_tests/testapp/live_urls.py's ``bare``): the memory ceiling."""
    port = common_free_port()
    server = start_server(url, port)
    ctx = multiprocessing.get_context("spawn")
    ready, results, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    per = [(clients - 1) // processes] * processes
    per[0] += clients - 1 - sum(per)
    procs = []
    try:
        for n in [1, *per]:
            proc = ctx.Process(
                target=_client_process, args=(port, n, ready, results, stop, "/live/bare")
            )
            proc.start()
            procs.append(proc)
            if n == 1:
                ready.get(timeout=60)
                time.sleep(1.0)
                rss_one = rss_kb(server.pid)
        for _ in per:
            ready.get(timeout=600)
        time.sleep(2.0)
        return (rss_kb(server.pid) - rss_one) / (clients - 1)
    finally:
        stop.set()
        for _ in procs:
            results.get(timeout=120)
        for proc in procs:
            proc.join(timeout=60)
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def server_connections(url: str) -> int:
    with psycopg.connect(url, autocommit=True, application_name=MONITOR) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND application_name NOT IN (%s, %s)",
            [PRODUCER, MONITOR],
        ).fetchone()[0]


def live_run(url: str, args) -> dict:
    port = common_free_port()
    server = start_server(url, port)
    ctx = multiprocessing.get_context("spawn")
    try:
        # One client first: the hub and its connections exist, Django is warm.
        ready, results, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
        first = ctx.Process(target=_client_process, args=(port, 1, ready, results, stop))
        first.start()
        ready.get(timeout=60)
        time.sleep(1.0)
        rss_one = rss_kb(server.pid)
        # The first client, alone in its process, is the probe: its latency is the server's
        # fan-out to one client among all, with little client-side queueing.
        per = [(args.clients - 1) // args.client_processes] * args.client_processes
        per[0] += args.clients - 1 - sum(per)
        procs = [
            ctx.Process(target=_client_process, args=(port, n, ready, results, stop)) for n in per
        ]
        for proc in procs:
            proc.start()
        for _ in procs:
            ready.get(timeout=600)
        time.sleep(2.0)
        rss_all = rss_kb(server.pid)
        connections = server_connections(url)
        commits = ctx.Queue()
        producer = ctx.Process(
            target=_producer, args=(url, args.rate, args.seconds, False, commits)
        )
        cpu_before, wall_before = common.cpu_seconds(server.pid), time.monotonic()
        clients_before = [common.cpu_seconds(p.pid) for p in procs]
        producer.start()
        committed = commits.get(timeout=args.seconds + 600)
        wall = time.monotonic() - wall_before
        cpu = (common.cpu_seconds(server.pid) - cpu_before) / wall
        clients_cpu = (
            sum(common.cpu_seconds(p.pid) - before for p, before in zip(procs, clients_before))
            / wall
        )
        connections = max(connections, server_connections(url))
        time.sleep(2.0)  # the last deliveries
        rss_end = rss_kb(server.pid)
        stop.set()
        batches = [results.get(timeout=120) for _ in range(len(procs) + 1)]
        received = [r for batch in batches for r in batch]
        probe = min(batches, key=len)  # the probe's one connection
        for proc in [first, *procs, producer]:
            proc.join(timeout=60)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    latencies = [t - committed[s] for s, t in received if s in committed]
    expected = len(committed) * args.clients
    p50, p99 = percentiles(latencies)
    half = sorted(committed.values())[len(committed) // 2]
    late = [t - committed[s] for s, t in received if s in committed and committed[s] >= half]
    return {
        "probe": percentiles([t - committed[s] for s, t in probe if s in committed]),
        "second_half": percentiles(late),
        "clients_cpu": clients_cpu,
        "p50": p50,
        "p99": p99,
        "deliveries": len(latencies),
        "expected": expected,
        "per_client_kb": (rss_all - rss_one) / (args.clients - 1),
        "per_client_kb_end": (rss_end - rss_one) / (args.clients - 1),
        "rss_mb": rss_end / 1024,
        "cpu": cpu,
        "connections": connections,
    }


def common_free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the naive design -----------------------------------------------------------------------


async def _naive(url: str, limit: int) -> tuple[int, str, int]:
    """Open one LISTENing connection per client until the server refuses one."""
    conns = []
    try:
        for n in range(1, limit + 1):
            try:
                conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
            except psycopg.OperationalError as exc:
                return n, str(exc).strip().splitlines()[-1], len(conns)
            await conn.execute("LISTEN naive_live")
            conns.append(conn)
        return limit + 1, "", len(conns)
    finally:
        for conn in conns:
            await conn.close()


def naive_run() -> tuple[int, str, int]:
    from pgmsg_dev import devdb

    url = devdb.embedded_database_url(ROOT / ".pgdata-live", name="pgmsg_live")
    with psycopg.connect(url, autocommit=True) as conn:
        max_connections = int(conn.execute("SHOW max_connections").fetchone()[0])
    refused_at, answer, held = asyncio.run(_naive(url, 1000))
    return refused_at, answer, max_connections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--client-processes", type=int, default=4)
    args = parser.parse_args()

    url = common.scratch_url(SCRATCH_DB)
    common.django_setup(url, settings="bench.settings")
    from django.db import connections

    connections.close_all()  # only the server's sessions remain to be counted
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    print(
        f"live: {args.clients} SSE clients in {args.client_processes} processes, one uvicorn "
        f"process ({loop}), {args.rate:g} events/s for {args.seconds:g} s on category "
        f"{CATEGORY!r}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    )
    raw_p50, raw_p99 = raw_ceiling(url, args.rate, min(args.seconds, 10))
    got = live_run(url, args)
    print(
        f"  deliveries: {got['deliveries']:,} of {got['expected']:,} "
        f"({got['deliveries'] / args.seconds:,.0f}/s)"
    )
    print(
        f"  commit-to-client latency  p50 {got['p50']:8.1f} ms   p99 {got['p99']:8.1f} ms"
        f"   (target < 50 / < 250 ms)"
    )
    print(
        f"  the second half of the run alone: p50 {got['second_half'][0]:.1f} ms, p99 "
        f"{got['second_half'][1]:.1f} ms; the probe (one client alone in its process): p50 "
        f"{got['probe'][0]:.1f} ms, p99 {got['probe'][1]:.1f} ms"
    )
    print(
        f"  raw ceiling (1 LISTEN, NOTIFY per commit, no HTTP): p50 {raw_p50:.2f} ms, p99 "
        f"{raw_p99:.2f} ms; ratio raw/pgmsg p50 {raw_p50 / got['p50']:.3f}, "
        f"p99 {raw_p99 / got['p99']:.3f}"
    )
    bare_kb = bare_memory(url, args.clients, args.client_processes)
    print(
        f"  server memory per client: {got['per_client_kb']:.1f} KB connected, "
        f"{got['per_client_kb_end']:.1f} KB after the run (target < 50 KB); RSS "
        f"{got['rss_mb']:.0f} MB; a bare Django SSE view on the same server (no pgmsg): "
        f"{bare_kb:.1f} KB, ratio bare/pgmsg {bare_kb / got['per_client_kb']:.2f}"
    )
    print(
        f"  CPU while events flowed: server {got['cpu']:.2f} cores, client processes "
        f"{got['clients_cpu']:.2f} cores"
    )
    print(f"  server PostgreSQL connections: {got['connections']} (must be 1-2)")
    refused_at, answer, max_connections = naive_run()
    print(
        f"  naive (one LISTEN connection per client), max_connections={max_connections}: "
        f"client {refused_at} refused: {answer!r}"
    )


if __name__ == "__main__":
    main()
