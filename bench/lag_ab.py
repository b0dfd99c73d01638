"""Benchmark: append-to-handler latency of two pgmsg trees side by side, with the raw ceiling.

One producer appends one event at a time, in turn, to three scratch databases: one served by a
subscription worker of this tree, one by a worker of ``--base`` (another checkout, e.g. a git
worktree of the commit before a change), and one where a raw psycopg process LISTENs and
SELECTs (the ceiling, as in bench/events.py). Each event goes 20 ms after the one before, so
each database gets one every 60 ms, and all three meet the same moments of a noisy machine:
a single run of ``bench/events.py --only lag`` per tree, one after the other, moved by more
than the changes being measured (docs/decisions.md, "Handlers run while the claim record commits").

    python bench/lag_ab.py --base /tmp/wt-old [--count 300] [--gap 0.02]

Prints p25 / p50 / p75 per database, from just before the producer's statement to the first
line of the handler (the raw listener: the moment its SELECT returned). The producer sends ``SELECT
pgmsg_append(...)`` (one statement, autocommit) to both pgmsg databases, the same SQL for
either tree, and INSERT + NOTIFY in one transaction to the raw one. Uses DATABASE_URL's server
(or the embedded default) and scratch databases ``pgmsg_bench_lag_ab_*``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common, events  # noqa: E402

#: Run in each tree (its own code): a scratch database migrated by it, with the lag table.
SETUP = """
import sys
sys.path.insert(0, '.')
from bench import common
url = common.scratch_url({name!r})
common.django_setup(url, migrate=True)
import psycopg
with psycopg.connect(url, autocommit=True) as conn:
    conn.execute('CREATE TABLE bench_lag (sent float8, handled float8)')
print(url)
"""

#: Run in each tree: bench/events.py's subscription worker, its handler noting the lag.
WORKER = """
import sys
sys.path.insert(0, '.')
from bench import events
events.run_worker({url!r})
"""

APPEND = (
    "SELECT pgmsg_append('lag-1', 'lag', ARRAY['bench.tick'], ARRAY[%s], ARRAY['{}'], "
    "ARRAY[%s::uuid])"
)


def wait_for_rows(conn: psycopg.Connection, table: str, count: int) -> None:
    deadline = time.time() + 120
    while conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] < count:
        if time.time() > deadline:
            raise SystemExit(f"{table}: not every event was handled within 120 s")
        time.sleep(0.05)


def quartiles(lags: list[float]) -> str:
    q = statistics.quantiles([x * 1000 for x in lags], n=4)
    return f"p25 {q[0]:5.2f}   p50 {q[1]:5.2f}   p75 {q[2]:5.2f} ms   (n={len(lags)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the other checkout (a directory)")
    parser.add_argument("--count", type=int, default=300, help="events per database")
    parser.add_argument("--gap", type=float, default=0.02, help="seconds between two events")
    args = parser.parse_args()
    base = Path(args.base).resolve()
    if not (base / "pgmsg").is_dir():
        raise SystemExit(f"--base {base}: not a pgmsg checkout (no pgmsg/ there)")

    trees = {"this tree": ROOT, f"base ({base})": base}
    urls, workers = {}, []
    for i, (label, tree) in enumerate(trees.items()):
        setup = SETUP.format(name=f"pgmsg_bench_lag_ab_{i}")
        out = subprocess.run(
            [sys.executable, "-c", setup], cwd=tree, capture_output=True, text=True
        )
        if out.returncode:
            raise SystemExit(f"setting up {label} failed:\n{out.stderr[-2000:]}")
        urls[label] = out.stdout.strip().splitlines()[-1]
    raw_url = common.scratch_url("pgmsg_bench_lag_ab_raw")
    with psycopg.connect(raw_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE raw_lag_q (id bigserial PRIMARY KEY, sent float8)")
        conn.execute("CREATE TABLE raw_lag_result (sent float8, handled float8)")
    try:
        for label, tree in trees.items():
            worker = WORKER.format(url=urls[label])
            workers.append(subprocess.Popen([sys.executable, "-c", worker], cwd=tree))
        listener = multiprocessing.get_context("spawn").Process(
            target=events.raw_listener, args=(raw_url,)
        )
        listener.start()
        for url in urls.values():
            common.wait_listening(url, 'LISTEN "pgmsg"')
        common.wait_listening(raw_url, "LISTEN raw_lag")
        time.sleep(1)  # the workers' start-up sweeps
        print(
            f"Append-to-handler, {args.count} events per database, one every {args.gap * 1000:.0f}"
            f" ms in turn across 3 databases, {time.strftime('%Y-%m-%d %H:%M %Z')}, "
            f"{os.cpu_count()} CPU(s)",
            flush=True,
        )
        conns = {label: psycopg.connect(url, autocommit=True) for label, url in urls.items()}
        raw = psycopg.connect(raw_url, autocommit=True)
        for n in range(args.count):
            for conn in conns.values():
                sent = time.time()
                conn.execute(APPEND, [json.dumps({"n": n, "sent_at": sent}), str(uuid.uuid4())])
                time.sleep(args.gap)
            with raw.transaction():
                raw.execute("INSERT INTO raw_lag_q (sent) VALUES (%s)", [time.time()])
                raw.execute("NOTIFY raw_lag")
            time.sleep(args.gap)
        for conn in conns.values():
            wait_for_rows(conn, "bench_lag", args.count)
        wait_for_rows(raw, "raw_lag_result", args.count)
        for label, conn in conns.items():
            lags = [h - s for s, h in conn.execute("SELECT sent, handled FROM bench_lag")]
            print(f"  pgmsg, {label:<40} {quartiles(lags)}")
        lags = [h - s for s, h in raw.execute("SELECT sent, handled FROM raw_lag_result")]
        print(f"  {'raw INSERT + NOTIFY, LISTEN + SELECT':<47} {quartiles(lags)}")
    finally:
        for worker in workers:
            worker.terminate()
            worker.wait()
        listener.terminate()
        listener.join()


if __name__ == "__main__":
    main()
