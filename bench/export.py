"""Benchmark: Parquet export of N events with Spark, next to a single-process baseline.

Prints rows/s for exporting N events (default 1,000,000) with 1, 2 and 4 read partitions
through `pgmsg.export_tables` on Spark (`local[*]`; the read tasks write the Parquet with
pyarrow), the same with Spark's own Parquet writer (`writer="spark"`, the path of non-local
URLs) for 2 partitions, and, measured in the same run, a
single-process baseline without Spark: the same `COPY (SELECT ...) TO STDOUT` parsed into
pyarrow and written with `pq.write_table`. Spark's start-up time is printed apart and is not
in the export figures; the same reads into Spark's "noop" sink show what reading alone costs.
Every run is a full re-export with `--partition-by none`, so all runs
write the same rows and the same columns as the baseline.

Then (unless --no-cluster) the same exports on a Spark standalone cluster started from the
pyspark package (a Master and two Workers of 1 core each, executors of 512 MB, 127.0.0.1), and
(unless --no-stream) the streaming export (`pgmsg_export --follow`'s code, local[*]) following
a producer that appends --rate events/s for --seconds seconds: its sustained rate and its lag
(the age of the oldest event not yet in the lake, after each micro-batch).

    DATABASE_URL=postgres://... python bench/export.py [--n 1000000] [--partitions 1,2,4]
        [--no-cluster] [--no-stream] [--rate 2000] [--seconds 60] [--trigger 1]

Uses DATABASE_URL's server (or the embedded default) and a scratch database
`pgmsg_bench_export` that it drops and re-creates (events go into its pgmsg_event table,
written with COPY); the Parquet files go to a temporary directory that is removed at the end.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402

SCRATCH_DB = "pgmsg_bench_export"
# Spark binds where the host name resolves, else to the first interface: stay on 127.0.0.1.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
SETTINGS = "pgmsg_tests.settings"


def generate_events(url: str, n: int) -> float:
    """COPY n events (10 per stream) into pgmsg_event; returns the seconds it took."""
    started = time.perf_counter()
    with psycopg.connect(url) as conn, conn.cursor() as cursor:
        with cursor.copy(
            "COPY pgmsg_event (stream_name, category, version, type, data, metadata, message_id) "
            "FROM STDIN"
        ) as copy:
            chunk = io.StringIO()
            for i in range(n):
                chunk.write(
                    f"account-{i // 10}\taccount\t{i % 10 + 1}\taccount.deposited\t"
                    f'{{"amount": {i}, "currency": "EUR", "note": "deposit number {i}"}}\t'
                    f'{{"correlation_id": "c-{i // 10}"}}\t'
                    f"{i:08x}-0000-4000-8000-{i:012x}\n"
                )
                if i % 50_000 == 49_999:
                    copy.write(chunk.getvalue())
                    chunk = io.StringIO()
            copy.write(chunk.getvalue())
        cursor.execute("ANALYZE pgmsg_event")
    return time.perf_counter() - started


def wait_for_horizon(url: str) -> float:
    """Wait until no transaction older than the newest event is open (the export's horizon)."""
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        newest = conn.execute(
            "SELECT max(transaction_id)::text::bigint FROM pgmsg_event"
        ).fetchone()[0]
        while (
            conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint").fetchone()[
                0
            ]
            <= newest
        ):
            time.sleep(0.1)
    return time.perf_counter() - started


def baseline(out: Path) -> tuple[int, float]:
    """One process, no Spark: COPY the whole table into pyarrow, then pq.write_table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pgmsg import export
    from pgmsg.export.reading import read_range

    [table_plan] = export.plan(
        str(out), tables=["events"], partitions=1, partition_by="none", full=True
    )
    started = time.perf_counter()
    lo, hi = table_plan.key_range
    table = pa.Table.from_batches(
        list(read_range(table_plan.read, lo, hi)), schema=table_plan.read.arrow_schema()
    )
    out.mkdir(parents=True)
    pq.write_table(table, out / "events.parquet")
    return table.num_rows, time.perf_counter() - started


def read_only(spark, work: Path, parts: int) -> tuple[int, float]:
    from pgmsg import export
    from pgmsg.export.spark_source import FORMAT

    [table_plan] = export.plan(
        str(work), tables=["events"], partitions=parts, partition_by="none", full=True
    )
    started = time.perf_counter()
    frame = spark.read.format(FORMAT).options(**table_plan.read.to_options()).load()
    frame.write.format("noop").mode("overwrite").save()
    return table_plan.rows, time.perf_counter() - started


def on_cluster(work: Path, partition_counts: list[int]) -> list[tuple]:
    """The same full exports on a 2-worker standalone cluster (in this process: a new
    SparkContext after the local one stopped)."""
    from pgmsg import export
    from pgmsg_dev.sparkcluster import Cluster

    cluster = Cluster(work / "cluster")
    results = []
    try:
        started = time.perf_counter()
        cluster.start()
        took = time.perf_counter() - started
        print(f"standalone cluster (master + 2 workers) started in {took:.1f}s")
        conf = dict(pair.split("=", 1) for pair in cluster.conf()[1::2])
        conf.pop("spark.pyspark.python")  # executors run this interpreter (pgmsg not needed)
        conf.pop("spark.driver.memory")  # fixed when the first session started the JVM
        started = time.perf_counter()
        spark = export.start_spark(cluster.url, conf)
        spark.sparkContext.setLogLevel("ERROR")
        print(f"Spark start-up on the cluster: {time.perf_counter() - started:.1f}s (not counted)")
        for writer in export.WRITERS:  # each writer's first job warms it up; not counted
            export.export_tables(
                str(work / f"cwarmup{writer}"), spark=spark, tables=["events"], partitions=2,
                partition_by="none", full=True, writer=writer,
            )  # fmt: skip
        for parts, writer in [(p, "tasks") for p in partition_counts] + [(2, "spark")]:
            summary = export.export_tables(
                str(work / f"cluster{parts}{writer}"), spark=spark, tables=["events"],
                partitions=parts, partition_by="none", full=True, writer=writer,
            )  # fmt: skip
            [result] = summary.results
            results.append(
                (f"cluster (2 workers x 1 core), {parts} read partition(s)"
                 + (", Spark's writer" if writer == "spark" else ""), result.rows,
                 summary.seconds, result.bytes)
            )  # fmt: skip
        spark.stop()
    finally:
        cluster.stop()
    return results


def streaming(spark, url: str, work: Path, rate: int, seconds: float, trigger: float) -> str:
    """Follow pgmsg_event while a producer appends ``rate`` events/s; rate and lag."""
    import statistics
    import threading

    from pgmsg.export import follow

    progress: list = []
    #: Per micro-batch with rows: the age of its oldest row when the batch was reported
    #: (committed to the lake), i.e. the longest any of its rows waited for the lake.
    latencies: list[float] = []
    stop = threading.Event()
    with psycopg.connect(url, autocommit=True) as conn:
        # The batch part's million events would first be caught up with: start from nothing.
        conn.execute("TRUNCATE pgmsg_event, pgmsg_stream")
    watcher = psycopg.connect(url, autocommit=True)

    def on_progress(batch) -> None:
        start = (
            progress[-1].end
            if progress and progress[-1].end
            else {"transaction_id": 0, "position": 0}
        )
        progress.append(batch)
        if not batch.rows or not batch.end:
            return
        [(age,)] = watcher.execute(
            "SELECT extract(epoch FROM now() - min(recorded_at))::float8 FROM pgmsg_event"
            " WHERE (transaction_id, position) > (%s::text::xid8, %s)"
            " AND (transaction_id, position) <= (%s::text::xid8, %s)",
            [str(start["transaction_id"]), start["position"],
             str(batch.end["transaction_id"]), batch.end["position"]],
        ).fetchall()  # fmt: skip
        latencies.append(age)

    follower = threading.Thread(
        target=follow.follow,
        args=(str(work / "stream"),),
        kwargs=dict(
            checkpoint=str(work / "stream-checkpoint"), tables=["events"], spark=spark,
            trigger_seconds=trigger, stop=stop, echo=lambda line: None,
            on_progress=on_progress,
        ),
    )  # fmt: skip
    follower.start()
    while not progress:  # the first (empty) micro-batch: the query runs
        time.sleep(0.5)
    caught_up = len(progress)
    produced = 0
    chunk = max(1, rate // 10)
    with psycopg.connect(url, autocommit=True) as conn:
        began = time.perf_counter()
        while time.perf_counter() - began < seconds:
            conn.execute(
                "INSERT INTO pgmsg_event (stream_name, category, version, type, data, metadata,"
                " message_id) SELECT 'live-' || (%(p)s + i), 'live', 1, 'live.tick',"
                " jsonb_build_object('i', %(p)s + i), '{}', gen_random_uuid()"
                " FROM generate_series(1, %(n)s) AS i",
                {"p": produced, "n": chunk},
            )
            produced += chunk
            time.sleep(max(0.0, produced / rate - (time.perf_counter() - began)))
        produced_seconds = time.perf_counter() - began
    while progress[-1].behind_rows:  # drain what is left
        time.sleep(0.2)
    drained = time.perf_counter() - began
    stop.set()
    follower.join()
    watcher.close()
    live = progress[caught_up:]
    lags = [p.behind_seconds for p in live if p.rows]
    durations = [p.seconds for p in live if p.rows]
    exported = sum(p.rows for p in live)

    def spread(values: list[float]) -> str:
        values = values or [0.0]
        many = len(values) > 1
        p90 = statistics.quantiles(values, n=10, method="inclusive")[-1] if many else values[0]
        return f"median {statistics.median(values):.1f}s, p90 {p90:.1f}s, max {max(values):.1f}s"

    return (
        f"\nstreaming export (local[*], trigger {trigger:g}s): producer {produced:,} events in "
        f"{produced_seconds:.1f}s ({produced / produced_seconds:,.0f}/s); exported {exported:,} in "
        f"{len(lags)} micro-batch(es), all in the lake {drained:.1f}s after the producer started "
        f"({exported / drained:,.0f}/s sustained)\n"
        f"  micro-batch duration: {spread(durations)}\n"
        f"  lag after each batch (age of the oldest event not yet exported): {spread(lags)}\n"
        f"  latency of each batch (age of its oldest event when committed): "
        f"{spread(latencies[-len(lags) :] if lags else [])}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="events to export")
    parser.add_argument("--partitions", default="1,2,4", help="read partitions to try")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--no-cluster", action="store_true", help="skip the standalone cluster")
    parser.add_argument("--no-stream", action="store_true", help="skip the streaming export")
    parser.add_argument("--rate", type=int, default=2000, help="streaming: events/s produced")
    parser.add_argument("--seconds", type=float, default=60, help="streaming: producer run")
    parser.add_argument("--trigger", type=float, default=1.0, help="streaming: trigger (s)")
    args = parser.parse_args()
    partition_counts = [int(p) for p in args.partitions.split(",")]

    url = common.scratch_url(SCRATCH_DB)
    common.django_setup(url)
    from pgmsg import export

    print(
        f"pgmsg export benchmark: {args.n:,} events; {os.cpu_count()} CPUs, "
        f"{platform.system()} {platform.machine()}, Python {platform.python_version()}"
    )
    print(f"load average at the start: {' / '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"generate (COPY into pgmsg_event): {generate_events(url, args.n):.1f}s")
    waited = wait_for_horizon(url)
    if waited > 0.5:
        print(f"waited {waited:.1f}s for older transactions on the server to end")

    work = Path(tempfile.mkdtemp(prefix="pgmsg-bench-export-"))
    results = []
    try:
        rows, seconds = baseline(work / "baseline")
        size = sum(f.stat().st_size for f in (work / "baseline").rglob("*.parquet"))
        results.append(
            ("baseline: COPY -> pyarrow -> pq.write_table (1 process)", rows, seconds, size)
        )

        started = time.perf_counter()
        spark = export.start_spark(args.master, {"spark.ui.enabled": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        print(
            f"Spark start-up ({spark.sparkContext.master}): "
            f"{time.perf_counter() - started:.1f}s (not counted below)"
        )
        # Warm-up of each writer: the first job pays for Python worker start and JIT; not counted.
        for writer in export.WRITERS:
            export.export_tables(
                str(work / f"warmup{writer}"),
                spark=spark,
                tables=["events"],
                partitions=2,
                partition_by="none",
                full=True,
                writer=writer,
            )
        for parts, writer in [(p, "tasks") for p in partition_counts] + [(2, "spark")]:
            summary = export.export_tables(
                str(work / f"spark{parts}{writer}"),
                spark=spark,
                tables=["events"],
                partitions=parts,
                partition_by="none",
                full=True,
                writer=writer,
            )
            [result] = summary.results
            results.append(
                (
                    f"Spark export, {parts} read partition(s)"
                    + (", Spark's writer" if writer == "spark" else ""),
                    result.rows,
                    summary.seconds,
                    result.bytes,
                )
            )
        # The same reads into Spark's "noop" sink: what reading costs without the Parquet write.
        for parts in partition_counts:
            rows, seconds = read_only(spark, work, parts)
            results.append(
                (f"  read only (noop sink), {parts} read partition(s)", rows, seconds, 0)
            )
        print_table(results)  # the figures so far, in case a later part fails
        if not args.no_cluster:
            spark.stop()
            results += on_cluster(work, partition_counts)
            print_table(results)
            spark = export.start_spark(args.master, {"spark.ui.enabled": "false"})
            spark.sparkContext.setLogLevel("ERROR")
        if not args.no_stream:
            print(streaming(spark, url, work, args.rate, args.seconds, args.trigger))
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average at the end: {' / '.join(f'{x:.1f}' for x in os.getloadavg())}")


def print_table(results: list[tuple]) -> None:
    """The figures, each export's rate also as a ratio to the baseline of the same run."""
    _, base_rows, base_seconds, _ = results[0]
    base_rate = base_rows / base_seconds
    print(f"\n{'what':<58} {'rows':>10} {'seconds':>8} {'rows/s':>10} {'x base':>7} {'MB':>7}")
    for name, rows, seconds, size in results:
        rate = rows / seconds
        print(
            f"{name:<58} {rows:>10,} {seconds:>8.1f} {rate:>10,.0f} {rate / base_rate:>6.2f}x "
            f"{size / 1e6:>7.1f}"
        )


if __name__ == "__main__":
    main()
