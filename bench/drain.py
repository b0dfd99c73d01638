"""Benchmark: one worker draining a prefilled backlog, next to the raw psycopg worker.

Fills N exactly-once notifications (no worker running), then times one in-process pgmsg
Worker (until idle, a listener that only counts) from its first claim to the empty table;
in the same run, the raw ceiling: psycopg `DELETE ... WHERE id IN (SELECT ... FOR UPDATE SKIP
LOCKED LIMIT 100) RETURNING` per transaction on a table of the same N rows, `json.loads` on
each payload. Also two `listen` processes draining the same backlog, next to one `listen`
process in the same harness (woken by the backlog's commit, a listener that writes a line per
message: timed_pgmsg_processes), and the claim rate as the table grows: a backlog of --big
rows next to a backlog of --small rows. With --busy K, the one-process lines again (raw and
pgmsg) while K other processes keep the machine's cores busy (each a plain Python loop,
started before and stopped after each timed drain): the worker then gets a share of a CPU,
not a CPU, and each of its waits on a server process costs a turn in the scheduler's queue.
Each measurement runs --reps times (min / median / max).

    python bench/drain.py [--n 50000] [--reps 3] [--big 0] [--busy 0]

Uses DATABASE_URL's server (or the embedded default) and a scratch database that it drops
and re-creates.
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

SCRATCH_DB = "pgmsg_bench_drain"
RAW_SCHEMA = """
DROP TABLE IF EXISTS raw_q;
CREATE TABLE raw_q (id bigserial PRIMARY KEY, payload jsonb NOT NULL);
"""


def fill_pgmsg(url: str, n: int, channel: str = "bench.drain") -> None:
    """n stored notifications of ``channel``, as notify_many() would store them (COPY: fast)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE pgmsg_notification")
        with (
            conn.cursor() as cur,
            cur.copy("COPY pgmsg_notification (channel, payload) FROM STDIN") as copy,
        ):
            for i in range(n):
                copy.write_row([channel, json.dumps({"seq": i, "ts": 0.0})])
        conn.execute("VACUUM ANALYZE pgmsg_notification")


def fill_raw(url: str, n: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE raw_q")
        with conn.cursor() as cur, cur.copy("COPY raw_q (payload) FROM STDIN") as copy:
            for i in range(n):
                copy.write_row([json.dumps({"seq": i, "ts": 0.0})])
        conn.execute("VACUUM ANALYZE raw_q")


def raw_drain(url: str, limit: int = 100) -> None:
    with psycopg.connect(url) as conn:
        while True:
            with conn.transaction():
                rows = conn.execute(
                    "DELETE FROM raw_q WHERE id IN (SELECT id FROM raw_q ORDER BY id "
                    "FOR UPDATE SKIP LOCKED LIMIT %s) RETURNING id, payload::text",
                    [limit],
                ).fetchall()
            for _, payload in rows:
                json.loads(payload)
            if not rows:
                return


def timed_raw(url: str, n: int, consumers: int = 1) -> float:
    fill_raw(url, n)
    procs = [multiprocessing.Process(target=raw_drain, args=(url,)) for _ in range(consumers)]
    t = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return n / (time.perf_counter() - t)


def pgmsg_drain() -> int:
    """Drain bench.drain until idle in this process; the messages handled (checked against
    the listener's own count)."""
    from bench.benchapp import listeners
    from pgmsg.core.worker import Worker

    before = listeners.drained
    worker = Worker(channel_names=["bench.drain"], until_idle=True, install_signal_handlers=False)
    worker.run()
    assert listeners.drained - before == worker.handled, "the listener's count differs"
    return worker.handled


def timed_pgmsg(url: str, n: int) -> float:
    fill_pgmsg(url, n)
    t = time.perf_counter()
    handled = pgmsg_drain()
    rate = n / (time.perf_counter() - t)
    assert handled == n, f"handled {handled} of {n}"
    return rate


def timed_pgmsg_processes(url: str, n: int, workers: int) -> float:
    """`listen` processes (started, listening, then the backlog appears at once), with the
    listener that notes each message's seq and time: timed from the backlog's commit to the
    last message handled. The end is read from those times, not by polling the table: a
    query every few ms over a table whose head is dead rows took a core from the workers
    (one `listen` process measured 21,000 msg/s that way, against 61,000 in-process)."""
    fill_pgmsg(url, 0)
    with tempfile.TemporaryDirectory() as handled:
        procs = nbench.start_workers(url, workers, handled)
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE TEMP TABLE staged (channel text, payload jsonb)")
                with (
                    conn.cursor() as cur,
                    cur.copy("COPY staged (channel, payload) FROM STDIN") as copy,
                ):
                    for i in range(n):
                        copy.write_row(["bench.tick", json.dumps({"seq": i, "ts": 0.0})])
                # One commit makes the whole backlog visible; the workers are woken by it.
                conn.execute(
                    "INSERT INTO pgmsg_notification (channel, payload) "
                    "SELECT channel, payload FROM staged"
                )
                committed = time.time()  # the clock of the listener's handled-at times
                while conn.execute("SELECT EXISTS (SELECT FROM pgmsg_notification)").fetchone()[0]:
                    time.sleep(0.2)
        finally:
            nbench.stop_workers(procs)
        lines = nbench.handled_lines(handled)
    assert sorted(seq for seq, _, _ in lines) == list(range(n)), "exactly-once check failed"
    return n / (max(handled_at for _, _, handled_at in lines) - committed)


def spin() -> None:
    """Keep one CPU busy until terminated (the --busy load)."""
    while True:
        pass


def while_busy(load: int, timed, *args) -> float:
    """``timed(*args)`` while ``load`` spinning processes compete for the cores."""
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(load)]
    for p in spinners:
        p.start()
    try:
        return timed(*args)
    finally:
        for p in spinners:
            p.terminate()
        for p in spinners:
            p.join()


def growth(url: str, n: int, big: int) -> tuple[float, float]:
    """Drain rate of a `big` backlog (the dead tuples a delete-based queue leaves at its head
    pile up as it drains), and of an `n` backlog, by the same in-process worker."""
    return timed_pgmsg(url, big), timed_pgmsg(url, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--big", type=int, default=0, help="backlog for the growth line (0: off)")
    parser.add_argument("--small", type=int, default=10_000, help="the growth line's reference")
    parser.add_argument("--growth-only", action="store_true", help="only the growth line")
    parser.add_argument(
        "--busy", type=int, default=0, help="spinning processes for the busy-machine lines (0: off)"
    )
    parser.add_argument("--busy-only", action="store_true", help="only the busy-machine lines")
    args = parser.parse_args()

    url = common.scratch_url(SCRATCH_DB)
    with psycopg.connect(url, autocommit=True) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
        autovacuum = conn.execute("SHOW autovacuum").fetchone()[0]
        conn.execute(RAW_SCHEMA)
    print(
        f"pgmsg drain benchmark  N={args.n}  PostgreSQL {server} (autovacuum={autovacuum})  "
        f"{os.cpu_count()} cores  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  "
        f"{args.reps} reps (min / median / max)"
    )
    common.django_setup(url, "bench.settings")
    os.environ.setdefault("BENCH_HANDLED_DIR", tempfile.mkdtemp())
    raw1, raw2, one, one_listen, two, ratio1, ratio2 = [], [], [], [], [], [], []
    for _ in range(0 if args.growth_only or args.busy_only else args.reps):
        raw1.append(timed_raw(url, args.n))
        one.append(timed_pgmsg(url, args.n))
        ratio1.append(one[-1] / raw1[-1])
        raw2.append(timed_raw(url, args.n, consumers=2))
        # The 2-process line's own harness with one process: what "two faster than one"
        # compares against (the in-process line above skips the wake-up and the per-message
        # line that the `listen` processes' listener writes).
        one_listen.append(timed_pgmsg_processes(url, args.n, 1))
        two.append(timed_pgmsg_processes(url, args.n, 2))
        ratio2.append(two[-1] / raw2[-1])
    print(f"\n{'measurement':<62} {'msg/s (min med max)':>29}  ratio to raw")
    if raw1:
        print(f"{'raw psycopg worker, 1 process, LIMIT 100':<62} {spread(raw1)}")
        print(f"{'pgmsg Worker, 1 process, batch 100':<62} {spread(one)}  {spread(ratio1, '.2f')}")
        print(f"{'raw psycopg worker, 2 processes':<62} {spread(raw2)}")
        print(f"{'pgmsg listen, 2 processes':<62} {spread(two)}  {spread(ratio2, '.2f')}")
        print(
            f"{'pgmsg listen, 1 process (ratio: 2 processes to 1)':<62} {spread(one_listen)}  "
            f"{spread([a / b for a, b in zip(two, one_listen)], '.2f')}"
        )
        med = statistics.median
        n = args.n
        summary.record(f"drain a prefilled backlog of {n:,}, 1 process", med(one), med(raw1))
        summary.record(f"drain a prefilled backlog of {n:,}, 2 processes", med(two), med(raw2))
        summary.record(
            f"drain a prefilled backlog of {n:,}, 2 listen processes "
            "(ratio column: to 1 listen process)",
            med(two),
            med(one_listen),
        )
    if args.busy:
        busy_raw, busy_one, busy_ratio = [], [], []
        for _ in range(args.reps):
            busy_raw.append(while_busy(args.busy, timed_raw, url, args.n))
            busy_one.append(while_busy(args.busy, timed_pgmsg, url, args.n))
            busy_ratio.append(busy_one[-1] / busy_raw[-1])
        load = f"{args.busy} spinning processes"
        print(f"{f'raw psycopg worker, 1 process, {load}':<62} {spread(busy_raw)}")
        print(
            f"{f'pgmsg Worker, 1 process, {load}':<62} {spread(busy_one)}  "
            f"{spread(busy_ratio, '.2f')}"
        )
        summary.record(
            f"drain a prefilled backlog of {args.n:,}, 1 process, machine busy ({load})",
            statistics.median(busy_one),
            statistics.median(busy_raw),
        )
    if args.big:
        big_rates, small_rates, ratios = [], [], []
        for _ in range(args.reps):
            big_rate, small_rate = growth(url, args.small, args.big)
            big_rates.append(big_rate)
            small_rates.append(small_rate)
            ratios.append(big_rate / small_rate)
        label = f"pgmsg Worker, 1 process, a {args.big:,} backlog"
        print(f"{label:<62} {spread(big_rates)}  {spread(ratios, '.2f')} (to the next line)")
        print(f"{f'pgmsg Worker, 1 process, a {args.small:,} backlog':<62} {spread(small_rates)}")
        summary.record(
            f"drain a {args.big:,} backlog (ratio column: to a {args.small:,} backlog)",
            statistics.median(big_rates),
            statistics.median(small_rates),
        )


if __name__ == "__main__":
    main()
