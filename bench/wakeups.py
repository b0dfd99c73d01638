"""Benchmark: producers' commits with pgmsg's wake-ups, next to plain INSERT at the same W.

For W = 1, 8 and 32 producer processes, each committing one row per transaction for a fixed
time, in the same run: plain INSERT into a table with no trigger (the ceiling), the same with
a statement trigger that NOTIFYs in every transaction (what pgmsg did before its wake-ups),
and pgmsg's notify() (one message per transaction, Django autocommit) with no worker running
and with one `listen` worker draining the channel meanwhile. Then commit-to-handler latency on
an idle worker. Each measurement runs --reps times; min / median / max are printed.

The plain INSERT runs on psycopg's defaults, which prepare a statement on its fifth use (the
server then skips its parse and plan); notify() prepares its own statement on each
connection (PGMSG["PREPARE_STATEMENTS"], on by default). Two more producers compare the
unprepared forms: plain INSERT with psycopg's prepared statements off, and notify() with
PREPARE_STATEMENTS False (as behind a transaction-mode pooler that loses them).

    python bench/wakeups.py [--seconds 3] [--reps 3] [--writers 1,8,32]

Uses DATABASE_URL's server (or the embedded default) and a scratch database that it drops
and re-creates; nothing else is touched.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common, summary  # noqa: E402
from bench import notifications as nbench  # noqa: E402
from bench.common import spread  # noqa: E402

SCRATCH_DB = "pgmsg_bench_wakeups"

RAW_SCHEMA = """
DROP TABLE IF EXISTS raw_plain, raw_notify;
CREATE TABLE raw_plain (id bigserial PRIMARY KEY, channel text NOT NULL, payload jsonb NOT NULL);
CREATE TABLE raw_notify (LIKE raw_plain INCLUDING ALL);
CREATE FUNCTION raw_notify_wake() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_notify('raw', 'raw'); RETURN NULL; END $$;
CREATE TRIGGER raw_notify_wake AFTER INSERT ON raw_notify
    FOR EACH STATEMENT EXECUTE FUNCTION raw_notify_wake();
"""


#: The producers, by kind: what each sends in its transactions.
KINDS = ("plain", "plain-unprepared", "notify", "pgmsg", "pgmsg-unprepared", "pgmsg+worker")


def _produce(kind: str, url: str, start, deadline_box, counts) -> None:
    """One producer process: one row per transaction until the deadline."""
    payload = json.dumps({"seq": 0, "ts": 0.0})
    if kind.startswith("pgmsg"):
        from django.db import connection

        import pgmsg
        from bench.benchapp.listeners import Tick

        if kind == "pgmsg-unprepared":
            from django.conf import settings
            from django.test import override_settings

            override_settings(PGMSG={**settings.PGMSG, "PREPARE_STATEMENTS": False}).enable()
        connection.ensure_connection()
        start.wait()
        deadline, n = deadline_box.value, 0
        while time.time() < deadline:
            pgmsg.notify(Tick(seq=n))
            n += 1
        connection.close()
    else:
        table = "raw_notify" if kind == "notify" else "raw_plain"
        statement = f"INSERT INTO {table} (channel, payload) VALUES ('bench.tick', %s)"
        prepare = {"prepare_threshold": None} if kind == "plain-unprepared" else {}
        with psycopg.connect(url, autocommit=True, **prepare) as conn:
            start.wait()
            deadline, n = deadline_box.value, 0
            while time.time() < deadline:
                conn.execute(statement, [payload])
                n += 1
    counts.put(n)


def produce_rate(kind: str, url: str, writers: int, seconds: float) -> float:
    from django.db import connections

    connections.close_all()  # children must not share the parent's connection
    ctx = multiprocessing.get_context("fork")
    start, counts = ctx.Event(), ctx.Queue()
    deadline = ctx.Value("d", 0.0)
    procs = [
        ctx.Process(target=_produce, args=(kind, url, start, deadline, counts))
        for _ in range(writers)
    ]
    for p in procs:
        p.start()
    time.sleep(0.5 + 0.05 * writers)  # let every producer connect
    deadline.value = time.time() + seconds
    start.set()
    total = sum(counts.get(timeout=seconds + 120) for _ in procs)
    for p in procs:
        p.join()
    return total / seconds


def truncate(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE raw_plain, raw_notify, pgmsg_notification")
        conn.execute("CHECKPOINT")


def run(url: str, writers_list: list[int], seconds: float, reps: int) -> list[dict]:
    """Rates per (W, kind) over reps, and the ratios to plain INSERT of the same rep."""
    results = []
    for writers in writers_list:
        rates: dict[str, list[float]] = {}
        for _ in range(reps):
            rep = {}
            for kind in KINDS:
                truncate(url)
                if kind == "pgmsg+worker":
                    with tempfile.TemporaryDirectory() as handled:
                        procs = nbench.start_workers(url, 1, handled)
                        try:
                            rep[kind] = produce_rate("pgmsg", url, writers, seconds)
                        finally:
                            nbench.stop_workers(procs)
                else:
                    rep[kind] = produce_rate(kind, url, writers, seconds)
            for kind, rate in rep.items():
                rates.setdefault(kind, []).append(rate)
                rates.setdefault(kind + "/plain", []).append(rate / rep["plain"])
            # notify() unprepared against the plain INSERT on the same terms.
            rates.setdefault("pgmsg-unprepared/plain-unprepared", []).append(
                rep["pgmsg-unprepared"] / rep["plain-unprepared"]
            )
        results.append({"writers": writers, "rates": rates})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--writers", default="1,8,32")
    parser.add_argument("--latency-count", type=int, default=300)
    parser.add_argument("--latency-gap-ms", type=float, default=20.0)
    args = parser.parse_args()

    url = common.scratch_url(SCRATCH_DB)
    with psycopg.connect(url, autocommit=True) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
        settings = ", ".join(
            f"{name}={conn.execute(f'SHOW {name}').fetchone()[0]}"
            for name in ("fsync", "synchronous_commit", "autovacuum")
        )
        conn.execute(RAW_SCHEMA)
    print(
        f"pgmsg wake-up benchmark  PostgreSQL {server} ({settings})  {os.cpu_count()} cores  "
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}  {args.seconds:g} s per measurement, "
        f"{args.reps} reps (min / median / max)"
    )
    common.django_setup(url, "bench.settings")
    results = run(url, [int(w) for w in args.writers.split(",")], args.seconds, args.reps)
    labels = {
        "plain": "plain INSERT, 1 row/tx (ceiling)",
        "plain-unprepared": "plain INSERT, 1 row/tx, not prepared",
        "notify": "INSERT + statement-trigger NOTIFY, 1 row/tx",
        "pgmsg": "pgmsg notify(), 1 msg/tx, no worker",
        "pgmsg-unprepared": "pgmsg notify(), 1 msg/tx, PREPARE_STATEMENTS False",
        "pgmsg+worker": "pgmsg notify(), 1 msg/tx, 1 listen worker draining",
    }
    print(f"\n{'W':>3}  {'producer':<52} {'commits/s (min med max)':>29}  ratio to plain")
    for result in results:
        rates = result["rates"]
        for kind, label in labels.items():
            ratio = "" if kind == "plain" else spread(rates[kind + "/plain"], ".2f")
            print(f"{result['writers']:>3}  {label:<52} {spread(rates[kind])}  {ratio}")
        print(
            f"{'':>3}  {'notify() to plain INSERT, neither prepared':<52} {'':>29}  "
            f"{spread(rates['pgmsg-unprepared/plain-unprepared'], '.2f')}"
        )
        w = result["writers"]
        summary.record(
            f"notify(), 1 msg/tx, W={w} producers, no worker (vs plain INSERT)",
            statistics.median(rates["pgmsg"]),
            statistics.median(rates["plain"]),
        )
        summary.record(
            f"notify(), 1 msg/tx, W={w}, neither prepared (vs plain INSERT not prepared)",
            statistics.median(rates["pgmsg-unprepared"]),
            statistics.median(rates["plain-unprepared"]),
        )
    truncate(url)
    lat = nbench.latency(url, args.latency_count, args.latency_gap_ms / 1000)
    summary.record("wake-up commit-to-handler p50, idle worker", nbench.pct(lat, 50), unit="ms")
    print(
        f"\ncommit-to-handler latency, idle worker, {len(lat)} messages "
        f"{args.latency_gap_ms:.0f} ms apart: p50 {nbench.pct(lat, 50):.2f} ms  "
        f"p95 {nbench.pct(lat, 95):.2f} ms  p99 {nbench.pct(lat, 99):.2f} ms  "
        f"max {max(lat):.2f} ms"
    )


if __name__ == "__main__":
    main()
