"""A batch export run: plan every table, check the set-up, write each dataset, move watermarks.

Each registered table becomes one Parquet dataset, ``<output>/<name>``. Tables with a
``transaction_id xid8`` column are exported incrementally and gap-free: a run reads only
rows whose transaction id is below pgmsg's read horizon taken when the run starts (every
transaction below it that could write this database has committed or aborted, so that set of
rows can no longer change; transactions of other databases do not hold it back, see
pgmsg/core/horizon.py), and at least the previous run's horizon. That xmin becomes the table's
watermark once its dataset is written, so a transaction that commits late is exported by the
next run instead of being skipped. Tables without it are exported whole (a snapshot).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pgmsg.core import conf, errors, horizon
from pgmsg.export import files, output, planning, session, spark_source, watermarks

logger = logging.getLogger(__name__)

#: How local datasets are written: by the read tasks with pyarrow, or by Spark's writer.
WRITERS = ("tasks", "spark")


@dataclasses.dataclass
class TableResult:
    name: str
    rows: int
    #: Parquet files and bytes this run wrote (None when the output is not a local path).
    files: int | None
    bytes: int | None
    seconds: float
    watermark: int | None

    def describe(self) -> str:
        return (
            f"{self.name}: {self.rows} row(s), {_maybe(self.files)} file(s), "
            f"{_maybe(self.bytes)} byte(s) in {self.seconds:.1f}s"
            + (f"; watermark {self.watermark}" if self.watermark is not None else "")
        )


@dataclasses.dataclass
class ExportSummary:
    plans: list[planning.TablePlan]
    results: list[TableResult]
    spark_seconds: float = 0.0
    seconds: float = 0.0
    dry_run: bool = False
    #: Open transactions of this database that held the read horizon back when it was taken.
    blockers: list[horizon.Blocker] = dataclasses.field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.results)

    def describe(self) -> str:
        if self.dry_run:
            return "dry run: nothing written, no watermark moved"
        files = sum(r.files or 0 for r in self.results)
        size = sum(r.bytes or 0 for r in self.results)
        return (
            f"exported {self.rows} row(s) of {len(self.results)} table(s): "
            f"{files} file(s), {size} byte(s) in {self.seconds:.1f}s "
            f"(Spark start-up {self.spark_seconds:.1f}s)"
        )


def export_tables(
    output_path: str,
    *,
    tables: Sequence[str] | None = None,
    master: str | None = None,
    spark: Any = None,
    spark_conf: dict[str, str] | None = None,
    partitions: int | None = None,
    partition_by: str = "day",
    mode: str | None = None,
    full: bool = False,
    flatten: Iterable[str] = (),
    dry_run: bool = False,
    database_url: str | None = None,
    using: str | None = None,
    echo: Callable[[str], None] | None = None,
    writer: str = "tasks",
) -> ExportSummary:
    """Export ``tables`` (default: every registered table that exists) under ``output_path``.

    ``mode`` defaults to append for incremental tables and to overwrite for snapshot tables
    and ``full`` re-exports. Executors connect with ``database_url`` when given, else with
    the Django database's parameters. A table's watermark moves only after its dataset has
    been written; any failure raises :class:`errors.ExportError` and leaves it in place.
    ``writer="spark"`` writes local paths with Spark's own Parquet writer too (other URLs
    always go through it); the default has the read tasks write them with pyarrow.
    """
    echo = echo or logger.info
    started = time.monotonic()
    using = using or conf.get().DATABASE
    master = master or conf.get().EXPORT_SPARK_MASTER
    fields = _check_options(
        tables, partitions, partition_by, mode, writer, flatten, using, master, dry_run, spark
    )
    with watermarks.locked(using):
        plans = planning.plan(
            output_path,
            tables=tables,
            partitions=partitions,
            partition_by=partition_by,
            mode=mode,
            full=full,
            flatten=fields,
            database_url=database_url,
            using=using,
        )
        if not dry_run:
            output.check_writable(output_path)
        summary = _announce(plans, dry_run, using, echo)
        if dry_run:
            summary.seconds = time.monotonic() - started
            return summary
        spark = _spark_for(plans, spark, master, spark_conf, summary, echo)
        for table_plan in plans:
            result = _export_one(spark, table_plan, using=using, master=master, writer=writer)
            summary.results.append(result)
            echo(result.describe())
    summary.seconds = time.monotonic() - started
    return summary


def _check_options(
    tables, partitions, partition_by, mode, writer, flatten, using, master, dry_run, spark
) -> Any:
    """Refuse bad options before anything is read or written; the fields to flatten."""
    planning.check_options(partitions=partitions, partition_by=partition_by, mode=mode)
    if writer not in WRITERS:
        raise errors.ExportError(f"export: writer must be one of {WRITERS}, got {writer!r}")
    fields = planning.check_fields(flatten)
    if tables is not None:
        planning.select_tables(tables, using)  # an unknown name fails before anything else
    if not dry_run and spark is None:
        session.check(master)  # even when nothing is new: a broken set-up must not look fine
    return fields


def _announce(plans, dry_run: bool, using: str, echo: Callable[[str], None]) -> ExportSummary:
    """Say what each table's export does, and what holds the read horizon back."""
    for table_plan in plans:
        echo(("would export " if dry_run else "exporting ") + table_plan.describe())
    summary = ExportSummary(plans=plans, results=[], dry_run=dry_run)
    if any(p.transaction_range for p in plans):
        # What keeps incremental tables' newer rows for a later run (nothing is lost).
        summary.blockers = horizon.blockers(using=using)
        for blocker in summary.blockers:
            echo(f"read horizon held back by {blocker.describe(with_query=True)}")
    return summary


def _spark_for(plans, spark, master, spark_conf, summary: ExportSummary, echo) -> Any:
    """The Spark session given (prepared), or one started when a plan writes."""
    if spark is None and any(p.writes for p in plans):
        spark_started = time.monotonic()
        spark = session.start_spark(master, spark_conf or {})
        summary.spark_seconds = time.monotonic() - spark_started
        echo(
            f"Spark started in {summary.spark_seconds:.1f}s ({spark.sparkContext.master}, "
            f"application {spark.sparkContext.applicationId})"
        )
    elif spark is not None:
        session.prepare(spark)
    return spark


def _export_one(
    spark: Any, table_plan: planning.TablePlan, *, using: str, master: str, writer: str
) -> TableResult:
    started = time.monotonic()
    spec = table_plan.spec
    before = output.parquet_files(table_plan.path)
    if table_plan.writes:
        try:
            _write(spark, table_plan, writer)
        except Exception as exc:
            raise errors.ExportError(
                f"export: writing {spec.name} to {table_plan.path} failed; its watermark is "
                f"unchanged: {session.failure(exc, spark, master)}"
            ) from exc
    new_watermark = table_plan.transaction_range[1] if table_plan.transaction_range else None
    watermarks.save(spec.name, new_watermark, table_plan.rows, using=using)
    files = rows = size = None
    after = output.parquet_files(table_plan.path)
    if after is not None:
        new = sorted(set(after) - set(before or {}))
        files, size = len(new), sum(after[f] for f in new)
        rows = sum(output.parquet_rows(f) for f in new)
    return TableResult(
        name=spec.name,
        rows=table_plan.rows if rows is None else rows,
        files=files,
        bytes=size,
        seconds=time.monotonic() - started,
        watermark=new_watermark,
    )


def _write(spark: Any, table_plan: planning.TablePlan, writer: str) -> None:
    spark.sparkContext.setJobDescription(f"pgmsg export {table_plan.spec.name}")
    local = output.local_path(table_plan.path)
    if local is not None and writer == "tasks":
        # Each read task writes its rows with pyarrow where it read them (pgmsg/export/files.py):
        # rows never cross into the JVM, which Spark's Parquet writer below needs.
        files.write_dataset(
            spark,
            table_plan.read,
            local,
            partition_column=table_plan.partition_column,
            overwrite=table_plan.mode == "overwrite",
        )
        return
    # Other URLs (s3a://, hdfs://, ...): Spark's writer, through Hadoop's file systems.
    if table_plan.rows:
        frame = (
            spark.read.format(spark_source.FORMAT).options(**table_plan.read.to_options()).load()
        )
    else:  # overwriting with nothing: the dataset becomes empty (a snapshot of an empty table)
        frame = spark.createDataFrame([], table_plan.read.spark_schema())
    writer = frame.write.mode(table_plan.mode)
    if table_plan.partition_column:
        writer = writer.partitionBy(table_plan.partition_column)
    writer.parquet(table_plan.path)


def _maybe(value: int | None) -> str:
    return "?" if value is None else str(value)
