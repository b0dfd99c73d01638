"""Benchmark: the transactional inbox, next to the raw-PostgreSQL ceiling measured in the same run.

Prints receive rates (receive() one message per transaction, receive_many() 1,000 per
transaction; all new ids, and half of them duplicates) and processing rates for N messages
(default 10,000), unordered and ordered (N/100 messages in each of 100 aggregates), with 1 and
2 `manage.py listen` processes (from the commit of the N messages to the last one processed;
handlers do nothing, so the figures are pgmsg's own cost). The ceiling: plain psycopg
`INSERT ... ON CONFLICT DO NOTHING` into a table of the same shape, and claim 100 rows with
`FOR UPDATE SKIP LOCKED` + `UPDATE ... SET status = 'processed'` per transaction.

    DATABASE_URL=postgres://... python bench/inbox.py [--n 10000] [--single-n 2000]
        [--big 0 [--small 10000] [--growth-only]]

With --big, three more lines: one in-process worker draining a prefilled backlog of --big
messages, of --small messages, and of --big again while another session holds a snapshot open
(claims stay fast as the table grows: the ratio of the first and third to the second).

Uses DATABASE_URL's server (or the embedded default) and a scratch database
`pgmsg_bench_inbox` that it drops and re-creates; nothing else is touched.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common, summary  # noqa: E402

SCRATCH_DB = "pgmsg_bench_inbox"
SETTINGS = "pgmsg_tests.settings"


# -- raw PostgreSQL ceiling --------------------------------------------------------------------

RAW_SCHEMA = """
DROP TABLE IF EXISTS raw_inbox;
CREATE TABLE raw_inbox (
    id bigserial PRIMARY KEY, inbox text NOT NULL, message_id text NOT NULL, type text NOT NULL,
    payload jsonb NOT NULL, status text NOT NULL DEFAULT 'pending',
    received_at timestamptz NOT NULL DEFAULT now(), processed_at timestamptz,
    UNIQUE (inbox, message_id));
CREATE INDEX raw_inbox_pending ON raw_inbox (inbox, id) WHERE status = 'pending';
"""
RAW_INSERT = (
    "INSERT INTO raw_inbox (inbox, message_id, type, payload) "
    "VALUES ('raw', %s, 'tick', %s) ON CONFLICT DO NOTHING"
)


def raw_consume(url: str) -> None:
    with psycopg.connect(url) as conn:
        while True:
            with conn.transaction():
                ids = [
                    r[0]
                    for r in conn.execute(
                        "SELECT id FROM raw_inbox WHERE inbox = 'raw' AND status = 'pending' "
                        "ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED"
                    ).fetchall()
                ]
                if ids:
                    conn.execute(
                        "UPDATE raw_inbox SET status = 'processed', processed_at = now() "
                        "WHERE id = ANY(%s)",
                        [ids],
                    )
            if not ids:
                return


def raw_ceiling(url: str, n: int, n_single: int) -> list[tuple[str, float]]:
    out = []
    payload = '{"seq": 1}'
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(RAW_SCHEMA)
        t = time.perf_counter()
        for i in range(n_single):
            conn.execute(RAW_INSERT, [f"s-{i}", payload])
        out.append(
            (
                f"raw INSERT ON CONFLICT, 1 row/tx, new ids (N={n_single})",
                n_single / (time.perf_counter() - t),
            )
        )
        for label, ids in (("new ids", range(n)), ("half duplicates", range(n // 2, n + n // 2))):
            ids = list(ids)
            t = time.perf_counter()
            for start in range(0, n, 1000):
                with conn.transaction(), conn.cursor() as cur:
                    cur.executemany(
                        RAW_INSERT, [[f"m-{i}", payload] for i in ids[start : start + 1000]]
                    )
            out.append(
                (
                    f"raw INSERT ON CONFLICT, 1000 rows/tx, {label} (N={n})",
                    n / (time.perf_counter() - t),
                )
            )
    for consumers in (1, 2):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE raw_inbox SET status = 'pending', processed_at = NULL")
            conn.execute("VACUUM ANALYZE raw_inbox")
            count = conn.execute("SELECT count(*) FROM raw_inbox").fetchone()[0]
        procs = [multiprocessing.Process(target=raw_consume, args=(url,)) for _ in range(consumers)]
        t = time.perf_counter()
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        out.append(
            (
                f"raw claim 100 SKIP LOCKED + UPDATE/tx, {consumers} consumer(s) (N={count})",
                count / (time.perf_counter() - t),
            )
        )
    return out


# -- pgmsg -------------------------------------------------------------------------------------


def receive_rates(n: int, n_single: int) -> list[tuple[str, float, str]]:
    from django.db import connection, transaction

    import pgmsg

    out = []
    t = time.perf_counter()
    for i in range(n_single):
        pgmsg.receive("bench.unordered", f"s-{i}", type="tick", payload={"seq": i})
    out.append(
        (
            f"pgmsg receive(), 1 msg/tx, new ids (N={n_single})",
            n_single / (time.perf_counter() - t),
            "",
        )
    )
    t = time.perf_counter()
    for i in range(n_single):
        pgmsg.receive("bench.unordered", f"s-{i}", type="tick", payload={"seq": i})
    out.append(
        (
            f"pgmsg receive(), 1 msg/tx, all duplicates (N={n_single})",
            n_single / (time.perf_counter() - t),
            "",
        )
    )
    for label, ids in (("new ids", range(n)), ("half duplicates", range(n // 2, n + n // 2))):
        ids = list(ids)
        stored = 0
        t = time.perf_counter()
        for start in range(0, n, 1000):
            with transaction.atomic():
                stored += sum(
                    r.stored
                    for r in pgmsg.receive_many(
                        "bench.unordered",
                        [
                            {"message_id": f"m-{i}", "type": "tick", "payload": {"seq": i}}
                            for i in ids[start : start + 1000]
                        ],
                    )
                )
        out.append(
            (
                f"pgmsg receive_many(), 1000 msgs/tx, {label} (N={n})",
                n / (time.perf_counter() - t),
                f"{stored} stored",
            )
        )
    with connection.cursor() as cur:
        cur.execute("TRUNCATE pgmsg_inbox_message")
    return out


def listening(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query = 'LISTEN \"pgmsg\"'"
        ).fetchone()[0]


def not_processed(url: str, inbox: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pgmsg_inbox_message WHERE inbox = %s AND status <> 'processed'",
            [inbox],
        ).fetchone()[0]


def processing(url: str, n: int, inbox: str, workers: int) -> tuple[str, float, str]:
    from django.db import connection, transaction

    import pgmsg

    env = dict(os.environ, DATABASE_URL=url, DJANGO_SETTINGS_MODULE=SETTINGS)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "django", "listen", "--inbox", inbox, "-v", "0"],
            cwd=ROOT,
            env=env,
        )
        for _ in range(workers)
    ]
    try:
        deadline = time.time() + 60
        while listening(url) < workers:
            if time.time() > deadline:
                raise SystemExit("workers did not start listening within 60 s")
            time.sleep(0.05)
        ordered = inbox == "bench.ordered"
        with transaction.atomic():  # one commit, one NOTIFY
            pgmsg.receive_many(
                inbox,
                [
                    {
                        "message_id": f"p-{i}",
                        "type": "tick",
                        "payload": {"seq": i},
                        "aggregate_id": f"agg-{i % 100}" if ordered else None,
                    }
                    for i in range(n)
                ],
            )
        t = time.perf_counter()
        while not_processed(url, inbox):
            time.sleep(0.02)
        elapsed = time.perf_counter() - t
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=60)
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*), count(*) FILTER (WHERE attempts = 0 AND processed_at IS NOT "
            "NULL) FROM pgmsg_inbox_message WHERE inbox = %s",
            [inbox],
        )
        total, clean = cur.fetchone()
        cur.execute("TRUNCATE pgmsg_inbox_message")
    check = "all processed once" if total == clean == n else f"CHECK FAILED: {total}/{clean}"
    kind = "ordered, 100 aggregates" if ordered else "unordered"
    return (f"pgmsg processing, {kind}, {workers} worker process(es) (N={n})", n / elapsed, check)


def backlog_drain(url: str, n: int, *, hold_snapshot: bool = False) -> tuple[str, float, str]:
    """One in-process worker draining a prefilled backlog of ``n`` messages of an inbox without
    a priority map (its claims in arrival order), timed from its start to the empty backlog.
    ``hold_snapshot``: another session keeps a REPEATABLE READ transaction open meanwhile (a
    report, a pg_dump), so that index scans cannot mark the acknowledged messages' entries
    dead and every claim that reads the pending index from its start walks them all."""
    from django.db import connection, transaction

    import pgmsg
    from pgmsg.core.worker import Worker

    for start in range(0, n, 5000):
        with transaction.atomic():
            pgmsg.receive_many(
                "bench.unordered",
                [
                    {"message_id": f"g-{i}", "type": "tick", "payload": {"seq": i}}
                    for i in range(start, min(n, start + 5000))
                ],
            )
    connection.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE pgmsg_inbox_message")
    holder = psycopg.connect(url) if hold_snapshot else None
    if holder is not None:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pgmsg_claim")
    try:
        worker = Worker(inboxes=["bench.unordered"], until_idle=True, install_signal_handlers=False)
        t = time.perf_counter()
        worker.run()
        rate = n / (time.perf_counter() - t)
    finally:
        if holder is not None:
            holder.close()
    assert worker.handled == n, f"handled {worker.handled} of {n}"
    with connection.cursor() as cur:
        cur.execute("TRUNCATE pgmsg_inbox_message")
    held = ", a snapshot held open meanwhile" if hold_snapshot else ""
    return (f"pgmsg inbox drain, 1 process, a {n:,} backlog{held}", rate, "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument(
        "--single-n",
        type=int,
        default=2_000,
        help="messages for the one-per-transaction rows (they are slow)",
    )
    parser.add_argument(
        "--big", type=int, default=0, help="backlog of the drain-growth lines (0: off)"
    )
    parser.add_argument("--small", type=int, default=10_000, help="their reference backlog")
    parser.add_argument("--growth-only", action="store_true", help="only the drain-growth lines")
    args = parser.parse_args()

    url = common.scratch_url(SCRATCH_DB)
    with psycopg.connect(url) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
    print(
        f"pgmsg inbox benchmark  N={args.n}  PostgreSQL {server}  {os.cpu_count()} cores  "
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
    )
    rows: list[tuple[str, float, str]] = []
    if not args.growth_only:
        rows += [(name, rate, "") for name, rate in raw_ceiling(url, args.n, args.single_n)]
    common.django_setup(url)
    if not args.growth_only:
        rows += receive_rates(args.n, args.single_n)
        for inbox in ("bench.unordered", "bench.ordered"):
            for workers in (1, 2):
                rows.append(processing(url, args.n, inbox, workers))
    if args.big:
        rows.append(backlog_drain(url, args.big))
        rows.append(backlog_drain(url, args.small))
        rows.append(backlog_drain(url, args.big, hold_snapshot=True))
    width = max(len(r[0]) for r in rows)
    print(f"\n{'measurement':<{width}}  {'msg/s':>9}")
    for name, rate, note in rows:
        print(f"{name:<{width}}  {rate:>9,.0f}  {note}")
    if args.big:
        big, small = f"a {args.big:,} backlog", f"a {args.small:,} backlog"
        for held in ("", ", a snapshot held open meanwhile"):
            summary.record(
                f"inbox: drain {big}{held} (ratio column: to {small})",
                summary.find(rows, f"pgmsg inbox drain, 1 process, {big}{held}"),
                summary.find(rows, f"pgmsg inbox drain, 1 process, {small}"),
            )
    summary.pairs(
        rows,
        [
            (
                "inbox receive(), 1 msg/tx",
                "pgmsg receive(), 1 msg/tx, new ids",
                "raw INSERT ON CONFLICT, 1 row/tx",
            ),
            (
                "inbox processing, unordered, 1 worker process",
                "pgmsg processing, unordered, 1 worker",
                "raw claim 100 SKIP LOCKED + UPDATE/tx, 1 consumer",
            ),
        ],
    )


if __name__ == "__main__":
    main()
