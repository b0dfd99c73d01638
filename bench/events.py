"""Benchmark: the event store, next to the raw-PostgreSQL ceiling measured in the same run.

Prints append throughput (1 event per transaction, and batches of 100), the rate at which a
subscription catches up over 300,000 stored events (in-process worker, 1 and 4 partitions;
then 1 partition in a process of its own and 4 partitions on 2 processes, started alike; a
handler that does nothing) and read_all() paging, and the end-to-end lag of a subscription
(append to the handler's first line, p50/p95, a worker process woken by NOTIFY); beside each,
the same work done with plain psycopg on a plain table: INSERT, keyset SELECT, INSERT + NOTIFY
to a LISTENing process (in the lag run, its events and pgmsg's in turn).

    python bench/events.py [--events 300000] [--single 2000] [--lag-count 300] [--reps 3]
                           [--only appends,catchup,lag]

Uses DATABASE_URL's server (or the embedded default) and a scratch database
`pgmsg_bench_events` that it drops and re-creates; nothing else is touched.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common, summary  # noqa: E402

SCRATCH_DB = "pgmsg_bench_events"


def declare():
    """The bench's event type and subscriptions (after django.setup(), in every process)."""
    import pgmsg
    from pgmsg.events import store as events
    from pgmsg.events import subscriptions

    if "bench.tick" in events.event_types:
        return events.event_types["bench.tick"]

    class Tick(pgmsg.Event, type="bench.tick"):
        n: int
        sent_at: float = 0.0

    counted = {"n": 0}
    for partitions in (1, 4):
        sub = pgmsg.Subscription(
            f"bench-catchup-{partitions}", category="bench", partitions=partitions
        )
        sub.handler(Tick)(lambda recorded: counted.__setitem__("n", counted["n"] + 1))

    lag = pgmsg.Subscription("bench-lag", category="lag", partitions=1)

    @lag.handler(Tick)
    def record_lag(recorded) -> None:
        # Stamped on the handler's first line, as the raw listener stamps the moment its
        # SELECT returns: what follows (a cursor, the event's decoding) is the handler's work.
        handled = time.time()
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO bench_lag VALUES (%s, %s)", [recorded.event.sent_at, handled]
            )

    subscriptions.counted = counted
    return Tick


def rate(label: str, count: int, seconds: float) -> tuple[str, float]:
    return label, count / seconds


def show(rows: list[tuple[str, float]]) -> None:
    for label, value in rows:
        print(f"  {label:<70} {value:>9,.0f} /s", flush=True)


# -- appends -------------------------------------------------------------------------------------


def raw_appends(url: str, single: int, batches: int) -> list[tuple[str, float]]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE raw_event (id bigserial PRIMARY KEY, stream text NOT NULL, "
            "version int NOT NULL, data jsonb NOT NULL, message_id uuid UNIQUE, "
            "UNIQUE (stream, version))"
        )
        t = time.perf_counter()
        for i in range(single):
            conn.execute(
                "INSERT INTO raw_event (stream, version, data, message_id) VALUES (%s, %s, %s, %s)",
                [f"raw-{i % 100}", i // 100 + 1, json.dumps({"n": i}), uuid.uuid4()],
            )
        out = [rate(f"raw INSERT, 1 row/tx (N={single})", single, time.perf_counter() - t)]
        conn.execute("TRUNCATE raw_event")
        t = time.perf_counter()
        for i in range(single):  # what append() also does: wake the workers at commit
            with conn.transaction():
                conn.execute(
                    "INSERT INTO raw_event (stream, version, data, message_id) "
                    "VALUES (%s, %s, %s, %s)",
                    [f"raw-{i % 100}", i // 100 + 1, json.dumps({"n": i}), uuid.uuid4()],
                )
                conn.execute("SELECT pg_notify('raw', 'events:raw')")
        out.append(
            rate(f"raw INSERT + pg_notify, 1 row/tx (N={single})", single, time.perf_counter() - t)
        )
        conn.execute("TRUNCATE raw_event")
        t = time.perf_counter()
        for b in range(batches):
            conn.execute(
                "INSERT INTO raw_event (stream, version, data, message_id) "
                "SELECT %s, v, d::jsonb, i FROM unnest(%s::int[], %s::text[], %s::uuid[]) "
                "AS r(v, d, i)",
                [
                    f"raw-{b}",
                    list(range(1, 101)),
                    [json.dumps({"n": n}) for n in range(100)],
                    [uuid.uuid4() for _ in range(100)],
                ],
            )
        out.append(
            rate(
                f"raw INSERT, 100 rows/tx (N={batches * 100})",
                batches * 100,
                time.perf_counter() - t,
            )
        )
    return out


def pgmsg_appends(single: int, batches: int) -> list[tuple[str, float]]:
    import pgmsg

    Tick = declare()
    t = time.perf_counter()
    for i in range(single):
        pgmsg.append(f"append-{i % 100}", Tick(n=i))
    out = [
        rate(
            f"pgmsg append(), 1 event/tx, expected ANY (N={single})",
            single,
            time.perf_counter() - t,
        )
    ]
    t = time.perf_counter()
    for i in range(single):
        pgmsg.append(f"exact-{i % 100}", Tick(n=i), expected_version=i // 100)
    out.append(
        rate(
            f"pgmsg append(), 1 event/tx, exact expected version (N={single})",
            single,
            time.perf_counter() - t,
        )
    )
    t = time.perf_counter()
    for b in range(batches):
        pgmsg.append(f"batch-{b}", [Tick(n=n) for n in range(100)])
    out.append(
        rate(
            f"pgmsg append(), 100 events/tx (N={batches * 100})",
            batches * 100,
            time.perf_counter() - t,
        )
    )
    return out


# -- catching up ---------------------------------------------------------------------------------


def fill(url: str, count: int) -> None:
    """``count`` events in category "bench" (1,000-event appends over 100 streams), and the
    same rows in a plain table for the raw reads."""
    import pgmsg

    Tick = declare()
    for start in range(0, count, 1000):
        pgmsg.append(
            f"bench-{start // 1000 % 100}", [Tick(n=n) for n in range(start, start + 1000)]
        )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE raw_read AS SELECT position AS id, stream_name, version, "
            "type, data, metadata, message_id FROM pgmsg_event WHERE category = 'bench'"
        )
        conn.execute("ALTER TABLE raw_read ADD PRIMARY KEY (id)")
        conn.execute("VACUUM ANALYZE")


def raw_read(url: str, count: int, page: int) -> float:
    """Events/s of a psycopg keyset SELECT over the same rows (page at a time, json.loads)."""
    with psycopg.connect(url, autocommit=True) as conn:
        t, last, seen = time.perf_counter(), 0, 0
        while rows := conn.execute(
            "SELECT id, stream_name, version, type, data::text, metadata::text, "
            "message_id FROM raw_read WHERE id > %s ORDER BY id LIMIT %s",
            [last, page],
        ).fetchall():
            for row in rows:
                json.loads(row[4])
            seen += len(rows)
            last = rows[-1][0]
        assert seen == count, seen
        return count / (time.perf_counter() - t)


def catch_up(name: str, count: int, batch: int, share: tuple[int, int] | None = None) -> dict:
    """Run one worker until idle over subscription ``name``: start, end, events handled."""
    from pgmsg.core.worker import Worker
    from pgmsg.events import subscriptions

    subscriptions.counted["n"] = 0
    start = time.time()
    Worker(
        subscriptions=[name],
        until_idle=True,
        install_signal_handlers=False,
        batch_size=batch,
        partition=share,
    ).run()
    return {"start": start, "end": time.time(), "handled": subscriptions.counted["n"]}


def catch_up_process(url: str, name: str, count: int, share, go, results) -> None:
    common.django_setup(url, migrate=False)
    declare()
    go.wait()  # every process set up before the clock starts
    results.put(catch_up(name, count, 1000, share))


def catch_up_processes(url: str, name: str, count: int, processes: int) -> float:
    """Events/s of ``processes`` worker processes, each serving its share of the partitions,
    from the first start to the last end (Django set-up excluded)."""
    context = multiprocessing.get_context("spawn")
    go, results = context.Event(), context.Queue()
    children = [
        context.Process(
            target=catch_up_process, args=(url, name, count, (i, processes), go, results)
        )
        for i in range(processes)
    ]
    for child in children:
        child.start()
    time.sleep(3)  # Django set-up in each child
    go.set()
    runs = [results.get(timeout=600) for _ in children]
    for child in children:
        child.join()
    assert sum(r["handled"] for r in runs) == count, runs
    return count / (max(r["end"] for r in runs) - min(r["start"] for r in runs))


def reads_and_catch_up(url: str, count: int, reps: int) -> list[tuple[str, float]]:
    """The raw keyset read and pgmsg's catch-up, alternating, ``reps`` times each: medians
    (every rep's figures are printed)."""
    import pgmsg
    from pgmsg.events import subscription_operations

    declare()
    runs: dict[str, list[float]] = {}

    def note(label: str, value: float) -> None:
        runs.setdefault(label, []).append(value)
        print(f"  {label:<70} {value:>9,.0f} /s", flush=True)

    for _ in range(reps):
        print(f"  -- uptime: {os.getloadavg()[0]:.1f} (1-min load average)", flush=True)
        for page in (100, 1000):
            note(
                f"raw keyset SELECT + json.loads, {page}/page (N={count})",
                raw_read(url, count, page),
            )
        t, after, seen = time.perf_counter(), pgmsg.events.store.START, 0
        while page_ := pgmsg.read_all(after, category="bench", limit=1000):
            seen += len(page_)
            after = page_[-1].checkpoint
        assert seen == count, seen
        note(f"pgmsg read_all(), 1000/page (N={count})", count / (time.perf_counter() - t))
        for partitions, batch in ((1, 100), (1, 1000), (4, 1000)):
            name = f"bench-catchup-{partitions}"
            subscription_operations.reset(name)
            run = catch_up(name, count, batch)
            assert run["handled"] == count, run
            note(
                f"pgmsg subscription catch-up, {partitions} partition(s), 1 process, "
                f"batch {batch} (N={count})",
                count / (run["end"] - run["start"]),
            )
        # The two-process figure's comparison: one partition in one process started and
        # timed as each of the two is (a fresh process: its first batches pay what the
        # in-process runs above paid before them, the connection and cold caches).
        subscription_operations.reset("bench-catchup-1")
        note(
            f"pgmsg subscription catch-up, 1 partition(s), 1 process of its own, batch 1000 "
            f"(N={count})",
            catch_up_processes(url, "bench-catchup-1", count, 1),
        )
        subscription_operations.reset("bench-catchup-4")
        note(
            f"pgmsg subscription catch-up, 4 partition(s), 2 processes, batch 1000 (N={count})",
            catch_up_processes(url, "bench-catchup-4", count, 2),
        )
    print("  medians:")
    medians = [(label, statistics.median(values)) for label, values in runs.items()]
    show(medians)
    return medians


# -- lag -----------------------------------------------------------------------------------------


def run_worker(url: str) -> None:
    common.django_setup(url, migrate=False)
    declare()
    from pgmsg.core.worker import Worker

    Worker(subscriptions=["bench-lag"]).run()


def raw_listener(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("LISTEN raw_lag")
        last = 0
        while True:
            # Leave the notifies() generator before using the connection again.
            if not list(conn.notifies(timeout=1.0, stop_after=1)):
                continue
            rows = conn.execute(
                "SELECT id, sent FROM raw_lag_q WHERE id > %s ORDER BY id", [last]
            ).fetchall()
            now = time.time()
            for id_, sent in rows:
                conn.execute("INSERT INTO raw_lag_result VALUES (%s, %s)", [sent, now])
                last = id_


def percentiles(lags: list[float]) -> str:
    ms = sorted(x * 1000 for x in lags)
    q = statistics.quantiles(ms, n=100, method="inclusive")
    return f"p50 {q[49]:6.1f} ms   p95 {q[94]:6.1f} ms   max {ms[-1]:6.1f} ms   (n={len(ms)})"


#: Events in a row to one side of the lag run before the other's turn.
LAG_BLOCK = 50


def lag(url: str, count: int, gap: float) -> tuple[tuple[float, str], tuple[float, str]]:
    """(p50 in ms, percentiles line) of pgmsg, then of raw.

    The subscription worker and the raw listener wait side by side, and the producer feeds
    them in turn, LAG_BLOCK events ``gap`` apart to one, then as many to the other: both meet
    the same minutes of the machine (on this machine the speed of the same code moves by 2x
    between quarter hours, so two windows one after the other compared unlike moments), and
    each event follows one of its own kind, as in a run of one alone (fed one event each in
    turn, the raw figure came out above runs of the old way in the same minutes)."""
    import pgmsg

    Tick = declare()
    context = multiprocessing.get_context("spawn")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_lag (sent float8, handled float8)")
        conn.execute("CREATE TABLE raw_lag_q (id bigserial PRIMARY KEY, sent float8)")
        conn.execute("CREATE TABLE raw_lag_result (sent float8, handled float8)")

        worker = context.Process(target=run_worker, args=(url,))
        listener = context.Process(target=raw_listener, args=(url,))
        worker.start()
        listener.start()
        common.wait_listening(url, 'LISTEN "pgmsg"')
        common.wait_listening(url, "LISTEN raw_lag")
        time.sleep(1)  # the worker's start-up sweep
        ours_started = common.cpu_seconds(worker.pid)
        raw_started = common.cpu_seconds(listener.pid)
        for block in range(0, count, LAG_BLOCK):
            for i in range(block, min(block + LAG_BLOCK, count)):
                pgmsg.append("lag-1", Tick(n=i, sent_at=time.time()))
                time.sleep(gap)
            for _ in range(block, min(block + LAG_BLOCK, count)):
                with conn.transaction():
                    conn.execute("INSERT INTO raw_lag_q (sent) VALUES (%s)", [time.time()])
                    conn.execute("NOTIFY raw_lag")
                time.sleep(gap)
        for table in ("bench_lag", "raw_lag_result"):
            while conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] < count:
                time.sleep(0.05)
        ours_cpu = cpu_per_event(worker.pid, ours_started, count)
        raw_cpu = cpu_per_event(listener.pid, raw_started, count)
        for process in (worker, listener):
            process.terminate()
            process.join()
        ours = [h - s for s, h in conn.execute("SELECT sent, handled FROM bench_lag")]
        raw = [h - s for s, h in conn.execute("SELECT sent, handled FROM raw_lag_result")]
    return (p50(ours), percentiles(ours) + ours_cpu), (p50(raw), percentiles(raw) + raw_cpu)


def cpu_per_event(pid: int, started: float | None, count: int) -> str:
    """The CPU a waiting process used per event since ``started`` (its CPU seconds then): its
    waits and its looks while it lingers after each event, not only the event's handling."""
    used = common.cpu_us_per(pid, started, count)
    return "" if used is None else f"   process CPU {used:,.0f} us/event"


def p50(lags: list[float]) -> float:
    return statistics.median(lags) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--single", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--lag-count", type=int, default=300)
    parser.add_argument("--lag-gap", type=float, default=0.02)
    parser.add_argument("--reps", type=int, default=3, help="repetitions of the catch-up part")
    parser.add_argument(
        "--only", default="appends,catchup,lag", help="parts to run (appends, catchup, lag)"
    )
    args = parser.parse_args()

    url = common.scratch_url(SCRATCH_DB)
    common.django_setup(url, migrate=False)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    print(
        f"pgmsg event store benchmark, {time.strftime('%Y-%m-%d %H:%M %Z')}, "
        f"{os.cpu_count()} CPU(s), database {SCRATCH_DB}"
    )
    parts = set(args.only.split(","))
    rows: list[tuple[str, float]] = []
    if "appends" in parts:
        print(f"\nAppends (1-minute load average {os.getloadavg()[0]:.1f})")
        rows += (raw := raw_appends(url, args.single, args.batches))
        show(raw)
        rows += (ours := pgmsg_appends(args.single, args.batches))
        show(ours)
    if "catchup" in parts:
        print(f"\nCatching up over {args.events:,} events (handler does nothing)")
        fill(url, args.events)
        rows += reads_and_catch_up(url, args.events, args.reps)
    summary.pairs(
        rows,
        [
            (
                "append(), 1 event/tx",
                "pgmsg append(), 1 event/tx, expected ANY",
                "raw INSERT + pg_notify, 1 row/tx",
            ),
            ("append(), 100 events/tx", "pgmsg append(), 100 events/tx", "raw INSERT, 100 rows"),
            (
                "subscription catch-up, 1 partition, batch 1000",
                "pgmsg subscription catch-up, 1 partition(s), 1 process, batch 1000",
                "raw keyset SELECT + json.loads, 1000/page",
            ),
            (
                "subscription catch-up, 4 partitions (1 process), batch 1000",
                "pgmsg subscription catch-up, 4 partition(s), 1 process, batch 1000",
                "raw keyset SELECT + json.loads, 1000/page",
            ),
            (
                "subscription catch-up, 4 partitions on 2 processes "
                "(ratio column: to 1 partition on 1 process, each started alike)",
                "pgmsg subscription catch-up, 4 partition(s), 2 processes",
                "pgmsg subscription catch-up, 1 partition(s), 1 process of its own",
            ),
        ],
    )
    if "lag" not in parts:
        return
    print(
        f"\nEnd-to-end lag, {args.lag_count} events each way, {args.lag_gap * 1000:.0f} ms apart, "
        f"pgmsg's and raw's in turns of {LAG_BLOCK} (from before the producer's statement to the "
        "handler)"
    )
    ours, raw = lag(url, args.lag_count, args.lag_gap)
    summary.record("append commit-to-subscription-handler p50", ours[0], raw[0], unit="ms")
    print(f"  raw INSERT + NOTIFY -> LISTENing process SELECTs   {raw[1]}")
    print(f"  pgmsg append -> subscription worker handler        {ours[1]}")


if __name__ == "__main__":
    main()
