"""Benchmark: exactly-once channels end to end, next to the raw-PostgreSQL ceiling.

Prints, for N notifications (default 10,000): produce rate (1 per transaction and 1,000 per
transaction), end-to-end processing rate with 1 and 2 `manage.py listen` processes (producer
start to last message handled, every message checked to be handled exactly once), and
commit-to-handler latency p50/p95/p99 on an idle worker (from the moment the producer's
COMMIT returned, as the peer harness measures it); and, measured in the same run on the
same server with plain psycopg: INSERT rates and claim-with-SKIP-LOCKED-and-delete rates, one
row per transaction and 100 per transaction, with 1 and 2 consumers, and the same latency from
INSERT + NOTIFY to a LISTENing psycopg process that claims and deletes.

    python bench/notifications.py [--n 10000] [--latency-count 300]

Uses DATABASE_URL's server (or the embedded default) and a scratch database `pgmsg_bench`
that it drops and re-creates; nothing else is touched.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common, summary  # noqa: E402

SCRATCH_DB = "pgmsg_bench"


# -- raw PostgreSQL ceiling ----------------------------------------------------------------------

RAW_SCHEMA = """
DROP TABLE IF EXISTS raw_q;
CREATE TABLE raw_q (id bigserial PRIMARY KEY, payload jsonb NOT NULL);
"""


def raw_fill(url: str, n: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE raw_q")
        with conn.cursor() as cur, cur.copy("COPY raw_q (payload) FROM STDIN") as copy:
            for i in range(n):
                copy.write_row([json.dumps({"seq": i})])


def raw_listen(url: str, results: str) -> None:
    """The raw idle worker of raw_latency: LISTEN, and on each NOTIFY claim and delete what is
    there as raw_consume does (json.loads each payload), appending "seq time" lines to
    ``results`` when each row is handled."""
    with psycopg.connect(url, autocommit=True) as conn, open(results, "a", buffering=1) as out:
        conn.execute("LISTEN raw_wake")
        while True:
            # Leave the notifies() generator before using the connection again.
            if not list(conn.notifies(timeout=1.0, stop_after=1)):
                continue
            while True:
                with conn.transaction():
                    rows = conn.execute(
                        "DELETE FROM raw_q WHERE id IN (SELECT id FROM raw_q ORDER BY id "
                        "FOR UPDATE SKIP LOCKED LIMIT 100) RETURNING payload::text"
                    ).fetchall()
                    for (payload,) in rows:
                        out.write(f"{json.loads(payload)['seq']} {time.time()}\n")
                if len(rows) < 100:
                    break


def raw_latency(url: str, count: int, gap: float) -> list[float]:
    """What latency() measures, for the raw ceiling: INSERT + NOTIFY in one transaction, to a
    LISTENing psycopg process that claims and deletes (sorted, in ms)."""
    with tempfile.TemporaryDirectory() as handled_dir:
        results = os.path.join(handled_dir, "raw")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(RAW_SCHEMA)
            listener = multiprocessing.get_context("spawn").Process(
                target=raw_listen, args=(url, results)
            )
            listener.start()
            try:
                common.wait_listening(url, "LISTEN raw_wake")
                committed = {}
                for i in range(count):
                    with conn.transaction():
                        conn.execute(
                            "INSERT INTO raw_q (payload) VALUES (%s)", [json.dumps({"seq": i})]
                        )
                        conn.execute("NOTIFY raw_wake")
                    committed[i] = time.time()
                    time.sleep(gap)
                while conn.execute("SELECT count(*) FROM raw_q").fetchone()[0]:
                    if not listener.is_alive():
                        raise SystemExit("the raw listener died (see above)")
                    time.sleep(0.01)
            finally:
                listener.terminate()
                listener.join()
        with open(results) as lines:
            handled = [line.split() for line in lines]
    return sorted((float(at) - committed[int(seq)]) * 1000 for seq, at in handled)


def raw_consume(url: str, limit: int) -> None:
    with psycopg.connect(url) as conn:
        while True:
            with conn.transaction():
                rows = conn.execute(
                    "DELETE FROM raw_q WHERE id IN (SELECT id FROM raw_q ORDER BY id "
                    "FOR UPDATE SKIP LOCKED LIMIT %s) RETURNING id, payload",
                    [limit],
                ).fetchall()
            if not rows:
                return


def raw_ceiling(url: str, n: int, n_single: int) -> list[tuple[str, float]]:
    out = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(RAW_SCHEMA)
        t = time.perf_counter()
        for i in range(n_single):
            conn.execute("INSERT INTO raw_q (payload) VALUES (%s)", [json.dumps({"seq": i})])
        out.append((f"raw INSERT, 1 row/tx (N={n_single})", n_single / (time.perf_counter() - t)))
        conn.execute("TRUNCATE raw_q")
        t = time.perf_counter()
        for start in range(0, n, 1000):
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO raw_q (payload) VALUES (%s)",
                    [[json.dumps({"seq": i})] for i in range(start, start + 1000)],
                )
        out.append((f"raw INSERT, 1000 rows/tx (N={n})", n / (time.perf_counter() - t)))
    for limit, consumers, count in ((1, 1, n_single), (100, 1, n), (100, 2, n)):
        raw_fill(url, count)
        procs = [
            multiprocessing.Process(target=raw_consume, args=(url, limit)) for _ in range(consumers)
        ]
        t = time.perf_counter()
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        rate = count / (time.perf_counter() - t)
        out.append(
            (
                f"raw claim+delete SKIP LOCKED LIMIT {limit}/tx, {consumers} consumer(s) "
                f"(N={count})",
                rate,
            )
        )
    return out


# -- pgmsg -----------------------------------------------------------------------------------------


def start_workers(url: str, count: int, handled_dir: str) -> list[subprocess.Popen]:
    env = dict(
        os.environ,
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="bench.settings",
        BENCH_HANDLED_DIR=handled_dir,
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "django", "listen", "bench.tick", "-v", "0"], cwd=ROOT, env=env
        )
        for _ in range(count)
    ]
    deadline = time.time() + 60
    while listening(url) < count:
        if time.time() > deadline:
            raise SystemExit("workers did not start listening within 60 s")
        time.sleep(0.05)
    return procs


def listening(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query = 'LISTEN \"pgmsg\"'"
        ).fetchone()[0]


def stop_workers(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=60)


def handled_lines(handled_dir: str) -> list[tuple[int, float, float]]:
    rows = []
    for path in Path(handled_dir).glob("h-*.log"):
        for line in path.read_text().splitlines():
            seq, now, *ts = line.split()
            rows.append((int(seq), float(ts[0]) if ts else 0.0, float(now)))
    return rows


def pending(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pgmsg_notification").fetchone()[0]


def produce_rates(n: int, n_single: int) -> list[tuple[str, float]]:
    from django.db import connection, transaction

    import pgmsg
    from bench.benchapp.listeners import Tick

    out = []
    t = time.perf_counter()
    for i in range(n_single):
        pgmsg.notify(Tick(seq=i))
    out.append((f"pgmsg notify(), 1 msg/tx (N={n_single})", n_single / (time.perf_counter() - t)))
    t = time.perf_counter()
    for start in range(0, n, 1000):
        with transaction.atomic():
            pgmsg.notify_many(Tick(seq=i) for i in range(start, start + 1000))
    out.append((f"pgmsg notify_many(), 1000 msgs/tx (N={n})", n / (time.perf_counter() - t)))
    with connection.cursor() as cur:
        cur.execute("TRUNCATE pgmsg_notification")
    return out


def validation_cost(n: int) -> str:
    """notify() (1 msg/tx) with and without the send-time check, alternating in rounds."""
    from django.db import connection
    from django.test import override_settings

    import pgmsg
    from bench.benchapp.listeners import Tick

    spent = {True: 0.0, False: 0.0}
    rounds = 10
    for _ in range(rounds):
        for validate in (True, False):
            with override_settings(PGMSG={"VALIDATE_ON_SEND": validate}):
                t = time.perf_counter()
                for i in range(n // rounds):
                    pgmsg.notify(Tick(seq=i))
                spent[validate] += time.perf_counter() - t
    with connection.cursor() as cur:
        cur.execute("TRUNCATE pgmsg_notification")
    on, off = (n / spent[True], n / spent[False])
    # The check alone, without the database: what it adds to each message.
    from pgmsg.core import payloads

    text = payloads.dumps(Tick(seq=1))
    t = time.perf_counter()
    for _ in range(n * 10):
        payloads.check_decodes(Tick, text, what="bench")
    alone = (time.perf_counter() - t) / (n * 10) * 1e6
    return (
        f"notify() 1 msg/tx with the send-time type check {on:,.0f} msg/s, without "
        f"{off:,.0f} msg/s: ratio {on / off:.3f} (N={n} each, alternating rounds); "
        f"the check alone {alone:.1f} us per message"
    )


def end_to_end(url: str, n: int, workers: int) -> tuple[str, float, str]:
    from django.db import transaction

    import pgmsg
    from bench.benchapp.listeners import Tick

    with tempfile.TemporaryDirectory() as handled_dir:
        procs = start_workers(url, workers, handled_dir)
        try:
            t = time.perf_counter()
            for start in range(0, n, 1000):
                with transaction.atomic():
                    pgmsg.notify_many(Tick(seq=i) for i in range(start, min(start + 1000, n)))
            produced = time.perf_counter() - t
            while pending(url):
                time.sleep(0.005)
            elapsed = time.perf_counter() - t
        finally:
            stop_workers(procs)
        seqs = [seq for seq, _, _ in handled_lines(handled_dir)]
    once = sorted(seqs) == list(range(n))
    check = (
        "every message handled exactly once"
        if once
        else (f"EXACTLY-ONCE CHECK FAILED: {len(seqs)} handled, {len(set(seqs))} distinct")
    )
    return (
        f"pgmsg end-to-end, {workers} worker process(es), producer 1000 msgs/tx (N={n})",
        n / elapsed,
        f"{check}; producer done in {produced:.2f} s",
    )


def latency(url: str, count: int, gap: float, cpu: list[float] | None = None) -> list[float]:
    """Handler time minus the time the producer's COMMIT returned (as in the peer harness).
    ``cpu``, when given, gets the worker's CPU per message (us), lingering and waits included."""
    from django.db import transaction

    import pgmsg
    from bench.benchapp.listeners import Tick

    committed = {}
    with tempfile.TemporaryDirectory() as handled_dir:
        procs = start_workers(url, 1, handled_dir)
        try:
            started = common.cpu_seconds(procs[0].pid)
            for i in range(count):
                with transaction.atomic():
                    pgmsg.notify(Tick(seq=i))
                committed[i] = time.time()
                time.sleep(gap)
            while pending(url):
                time.sleep(0.01)
            used = common.cpu_us_per(procs[0].pid, started, count)
            if cpu is not None and used is not None:
                cpu.append(used)
        finally:
            stop_workers(procs)
        return sorted((now - committed[seq]) * 1000 for seq, _, now in handled_lines(handled_dir))


def pct(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1] if len(values) > 1 else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument(
        "--single-n",
        type=int,
        default=2_000,
        help="messages for the one-per-transaction rows (they are slow)",
    )
    parser.add_argument("--latency-count", type=int, default=300)
    parser.add_argument("--latency-gap-ms", type=float, default=20.0)
    args = parser.parse_args()

    url = common.scratch_url(SCRATCH_DB)
    with psycopg.connect(url) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
    print(
        f"pgmsg notification benchmark  N={args.n}  PostgreSQL {server}  "
        f"{os.cpu_count()} cores  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
    )
    rows: list[tuple[str, float, str]] = []
    rows += [(name, rate, "") for name, rate in raw_ceiling(url, args.n, args.single_n)]
    common.django_setup(url, "bench.settings")
    rows += [(name, rate, "") for name, rate in produce_rates(args.n, args.single_n)]
    check_cost = validation_cost(args.single_n)
    for workers in (1, 2):
        rows.append(end_to_end(url, args.n, workers))
    width = max(len(r[0]) for r in rows)
    print(f"\n{'measurement':<{width}}  {'msg/s':>9}")
    for name, rate, note in rows:
        print(f"{name:<{width}}  {rate:>9,.0f}  {note}")
    summary.pairs(
        rows,
        [
            ("notify(), 1 msg/tx (bench/notifications.py)", "pgmsg notify()", "raw INSERT, 1 row"),
            (
                "end to end, 1 listen process, producer 1000/tx",
                "pgmsg end-to-end, 1 worker",
                "raw claim+delete SKIP LOCKED LIMIT 100/tx, 1 consumer",
            ),
        ],
    )
    print(f"\n{check_cost}")
    cpu: list[float] = []
    lat = latency(url, args.latency_count, args.latency_gap_ms / 1000, cpu)
    raw = raw_latency(url, args.latency_count, args.latency_gap_ms / 1000)
    for p in (50, 99):
        summary.record(
            f"notification commit-to-handler p{p}, idle worker",
            pct(lat, p),
            pct(raw, p),
            unit="ms",
        )
    print(
        f"\ncommit-to-handler latency, idle worker, {len(lat)} messages "
        f"{args.latency_gap_ms:.0f} ms apart: pgmsg {percentiles(lat)}"
        + "".join(f"   worker CPU {c:,.0f} us/message" for c in cpu)
        + f"\n  raw INSERT + NOTIFY to a LISTENing psycopg process that claims: {percentiles(raw)}"
    )


def percentiles(lat: list[float]) -> str:
    return (
        f"p50 {pct(lat, 50):.2f} ms  p95 {pct(lat, 95):.2f} ms  p99 {pct(lat, 99):.2f} ms  "
        f"max {max(lat):.2f} ms"
    )


if __name__ == "__main__":
    main()
