"""Benchmark: Parquet export of N events with Spark, next to a single-process baseline.

Prints rows/s for exporting N events (default 1,000,000) with 1, 2 and 4 read partitions
through `pgmsg.export.export_tables` on Spark (`local[*]`), and, measured in the same run, a
single-process baseline without Spark: the same `COPY (SELECT ...) TO STDOUT` parsed into
pyarrow and written with `pq.write_table`. Spark's start-up time is printed apart and is not
in the export figures; the same reads into Spark's "noop" sink show what reading alone costs.
Every run is a full re-export with `--partition-by none`, so all runs
write the same rows and the same columns as the baseline.

    DATABASE_URL=postgres://... python bench/export.py [--n 1000000] [--partitions 1,2,4]

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
    from pgmsg.spark_source import read_range

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
    from pgmsg.spark_source import FORMAT, PgmsgDataSource

    spark.dataSource.register(PgmsgDataSource)
    [table_plan] = export.plan(
        str(work), tables=["events"], partitions=parts, partition_by="none", full=True
    )
    started = time.perf_counter()
    frame = spark.read.format(FORMAT).options(**table_plan.read.to_options()).load()
    frame.write.format("noop").mode("overwrite").save()
    return table_plan.rows, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="events to export")
    parser.add_argument("--partitions", default="1,2,4", help="read partitions to try")
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args()
    partition_counts = [int(p) for p in args.partitions.split(",")]

    url = common.scratch_url(SCRATCH_DB)
    common.django_setup(url)
    from pgmsg import export

    print(
        f"pgmsg export benchmark: {args.n:,} events; {os.cpu_count()} CPUs, "
        f"{platform.system()} {platform.machine()}, Python {platform.python_version()}"
    )
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
        # Warm-up: the first job pays for Python worker start and JIT; not counted.
        export.export_tables(
            str(work / "warmup"),
            spark=spark,
            tables=["events"],
            partitions=2,
            partition_by="none",
            full=True,
        )
        for parts in partition_counts:
            summary = export.export_tables(
                str(work / f"spark{parts}"),
                spark=spark,
                tables=["events"],
                partitions=parts,
                partition_by="none",
                full=True,
            )
            [result] = summary.results
            results.append(
                (
                    f"Spark export, {parts} read partition(s)",
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
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\n{'what':<58} {'rows':>10} {'seconds':>8} {'rows/s':>10} {'MB':>7}")
    for name, rows, seconds, size in results:
        print(f"{name:<58} {rows:>10,} {seconds:>8.1f} {rows / seconds:>10,.0f} {size / 1e6:>7.1f}")


if __name__ == "__main__":
    main()
