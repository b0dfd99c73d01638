"""Benchmark: a `listen` worker's memory stays flat as it handles more and more messages.

Starts one `manage.py listen bench.tick` process (the bench's near no-op listener), feeds it
exactly-once notifications in chunks (COPY into pgmsg_notification, then wait until the table
is empty), and reads the process's resident set size (VmRSS in /proc) after --small messages
and after --big messages. The target (issue 15): RSS after 1,000,000 within 20 MB of RSS after
100,000.

    python bench/memory.py [--small 100000] [--big 1000000] [--chunk 50000]

Uses DATABASE_URL's server (or the embedded default) and a scratch database that it drops
and re-creates.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common, summary  # noqa: E402
from bench import notifications as nbench  # noqa: E402

SCRATCH_DB = "pgmsg_bench_memory"


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def feed(url: str, first: int, count: int) -> None:
    """Store ``count`` messages at once, then wait until the worker has handled them all."""
    with psycopg.connect(url, autocommit=True) as conn:
        with (
            conn.cursor() as cur,
            cur.copy("COPY pgmsg_notification (channel, payload) FROM STDIN") as copy,
        ):
            for seq in range(first, first + count):
                copy.write_row(["bench.tick", json.dumps({"seq": seq, "ts": 0.0})])
        while conn.execute("SELECT EXISTS (SELECT FROM pgmsg_notification)").fetchone()[0]:
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=100_000)
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=50_000)
    args = parser.parse_args()

    url = common.scratch_url(SCRATCH_DB)
    common.django_setup(url, "bench.settings")
    print(
        f"pgmsg worker memory, {time.strftime('%Y-%m-%d %H:%M %Z')}, {os.cpu_count()} CPU(s), "
        f"1-minute load average {os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory() as handled:
        (worker,) = nbench.start_workers(url, 1, handled)
        try:
            print(f"  RSS of the listening worker before any message {rss_mb(worker.pid):8.1f} MB")
            done, started, figures = 0, time.perf_counter(), {}
            for mark in (args.small, args.big):
                while done < mark:
                    count = min(args.chunk, mark - done)
                    feed(url, done, count)
                    done += count
                figures[mark] = rss_mb(worker.pid)
                print(
                    f"  RSS after {done:>9,} messages {figures[mark]:8.1f} MB   "
                    f"({done / (time.perf_counter() - started):,.0f} msg/s so far)",
                    flush=True,
                )
            lines = sum(
                sum(1 for _ in open(os.path.join(handled, name))) for name in os.listdir(handled)
            )
            assert lines == args.big, f"handled {lines} of {args.big}"
        finally:
            nbench.stop_workers([worker])
    growth = figures[args.big] - figures[args.small]
    print(f"  growth from {args.small:,} to {args.big:,} messages: {growth:+.1f} MB")
    summary.record(
        f"worker RSS after {args.big:,} messages (raw column: after {args.small:,})",
        figures[args.big],
        figures[args.small],
        unit="MB",
    )


if __name__ == "__main__":
    main()
