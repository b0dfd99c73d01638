"""The continuous export: one Structured Streaming query per incremental table, appending
Parquet files through Spark's file sink, with a checkpoint directory.

The source's offsets are gap-free (transaction id, key) checkpoints (see ``source``), and
Spark writes each micro-batch's offsets to the checkpoint before running it and logs the files
of each committed batch in ``<dataset>/_spark_metadata``: after a crash the unfinished batch is
replayed with the same offsets, so each row lands in exactly one committed file. Files a killed
batch had already written are not in that log; they are deleted when the export starts again,
so readers that do not go through Spark see every row once too.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections
from psycopg import sql as pgsql

from pgmsg.core import conf, errors
from pgmsg.export import output, planning, reading, session, spark_source, tables, watermarks
from pgmsg.export.choices import DEFAULT_MAX_ROWS_PER_BATCH, DEFAULT_TRIGGER_SECONDS

logger = logging.getLogger(__name__)

QUERIES = reading.QUERIES
#: Where the warm-up writes its empty dataset, under the checkpoint directory.
WARM_UP = "_warm_up"


@dataclasses.dataclass
class Progress:
    """One finished micro-batch of one table."""

    table: str
    batch: int
    rows: int
    seconds: float
    end: dict | None
    #: Committed rows of the table not exported yet, and the age in seconds of the oldest.
    behind_rows: int
    behind_seconds: float

    def describe(self) -> str:
        point = (
            f"checkpoint ({self.end['transaction_id']}, {self.end['position']})"
            if self.end
            else "no checkpoint yet"
        )
        return (
            f"{self.table} batch {self.batch}: {self.rows} row(s) in {self.seconds:.1f}s, "
            f"{point}; behind the database: {self.behind_rows} row(s), oldest "
            f"{self.behind_seconds:.1f}s"
        )


@dataclasses.dataclass
class Stream:
    spec: tables.TableSpec
    read: reading.ReadPlan
    path: str
    checkpoint: str
    partition_column: str | None
    query: Any = None
    reported: int = -1


def follow(
    output_path: str,
    *,
    checkpoint: str,
    tables: Sequence[str] | None = None,
    master: str | None = None,
    spark: Any = None,
    spark_conf: dict[str, str] | None = None,
    trigger_seconds: float = DEFAULT_TRIGGER_SECONDS,
    max_rows_per_batch: int | None = DEFAULT_MAX_ROWS_PER_BATCH,
    partition_by: str = "day",
    flatten: Sequence[str] = (),
    database_url: str | None = None,
    using: str | None = None,
    echo: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
    install_signal_handlers: bool = False,
    on_progress: Callable[[Progress], None] | None = None,
) -> None:
    """Stream every new row of ``tables`` (default: each incremental table that exists) to
    ``<output_path>/<name>`` until ``stop`` is set (or SIGTERM/SIGINT with
    ``install_signal_handlers``), printing one line per micro-batch."""
    echo = echo or logger.info
    using = using or conf.get().DATABASE
    master = master or conf.get().EXPORT_SPARK_MASTER
    stop = stop or threading.Event()
    specs, fields = _followed_tables(
        tables, trigger_seconds, max_rows_per_batch, partition_by, flatten, using
    )
    if spark is None:
        session.check(master)
    conninfo = database_url or planning.conninfo_of(using)
    streams = _streams(
        specs, output_path, checkpoint, conninfo, partition_by, fields, max_rows_per_batch, using
    )
    output.check_writable(output_path)
    output.check_writable(checkpoint)
    for stream in streams:
        _check_dataset(stream)
    lock = watermarks.locked(using, f"pgmsg_export_follow:{checkpoint}", holder="follow export")
    with lock, _signals(stop, install_signal_handlers):
        for stream in streams:
            for orphan in output.remove_uncommitted(stream.path):
                echo(
                    f"{stream.spec.name}: removed {orphan}, written by a batch that never committed"
                )
        spark = _spark_for(spark, master, spark_conf, echo)
        try:
            _start_all(spark, streams, checkpoint, trigger_seconds, master, echo)
            while not stop.is_set():
                for stream in streams:
                    _report(stream, echo, using, on_progress)
                    _check_active(stream, spark, master)
                stop.wait(0.2)
        finally:
            _stop(streams, echo, using, on_progress)
    echo("stopped following")


def _followed_tables(tables, trigger_seconds, max_rows_per_batch, partition_by, flatten, using):
    """Refuse bad options; the tables to follow (named, or each incremental one) and the
    fields to flatten."""
    if not trigger_seconds > 0:
        raise errors.ExportError(f"export: the trigger interval must be > 0, got {trigger_seconds}")
    if max_rows_per_batch is not None and max_rows_per_batch < 1:
        raise errors.ExportError(
            f"export: max rows per batch must be a positive integer, got {max_rows_per_batch!r}"
        )
    planning.check_options(partitions=None, partition_by=partition_by, mode=None)
    fields = planning.check_fields(flatten)
    specs = planning.select_tables(tables, using)
    if tables is None:
        specs = [s for s in specs if s.incremental]
    snapshots = [s.name for s in specs if not s.incremental]
    if snapshots:
        raise errors.ExportError(
            f"export: {snapshots} cannot be followed (no transaction id: exported as "
            "snapshots by a batch run); leave them out of --tables"
        )
    if not specs:
        raise errors.ExportError("export: no incremental table to follow: run `manage.py migrate`")
    return specs, fields


def _streams(
    specs, output_path, checkpoint, conninfo, partition_by, fields, max_rows_per_batch, using
) -> list[Stream]:
    """One Stream per table: what it reads, where it writes, its checkpoint."""
    streams = []
    with connections[using].cursor() as cursor:
        for spec in specs:
            columns, partition_column = planning.read_columns(
                cursor, spec, partition_by=partition_by, flatten=fields
            )
            read = reading.ReadPlan(
                conninfo=conninfo,
                table=spec.table,
                key=spec.key,
                columns=tuple(columns),
                transaction_column=spec.transaction_column,
                max_rows_per_batch=max_rows_per_batch,
            )
            streams.append(
                Stream(
                    spec=spec,
                    read=read,
                    path=output.join(output_path, spec.name),
                    checkpoint=output.join(checkpoint, spec.name),
                    partition_column=partition_column,
                )
            )
    return streams


def _spark_for(spark: Any, master: str, spark_conf, echo: Callable[[str], None]) -> Any:
    """The Spark session given (prepared), or one started."""
    if spark is not None:
        session.prepare(spark)
        return spark
    started = time.monotonic()
    spark = session.start_spark(master, spark_conf or {}, name="pgmsg-export-follow")
    echo(
        f"Spark started in {time.monotonic() - started:.1f}s "
        f"({spark.sparkContext.master}, application {spark.sparkContext.applicationId})"
    )
    return spark


def _start_all(spark, streams: list[Stream], checkpoint, trigger_seconds, master, echo) -> None:
    """Warm the executors up, then start one streaming query per table."""
    try:
        _warm_up(spark, streams[0], checkpoint)
    except Exception as exc:
        raise errors.ExportError(
            f"export: reading {streams[0].spec.name} before following it failed: "
            + session.failure(exc, spark, master)
        ) from exc
    for stream in streams:
        stream.query = _start(spark, stream, trigger_seconds)
        echo(
            f"following {stream.spec.name} ({stream.spec.table}) into {stream.path}, "
            f"checkpoint {stream.checkpoint}, a micro-batch every {trigger_seconds:g}s"
        )


def _check_active(stream: Stream, spark: Any, master: str) -> None:
    if not stream.query.isActive:
        failure = stream.query.exception()
        raise errors.ExportError(
            f"export: following {stream.spec.name} stopped: "
            + (session.failure(failure, spark, master) if failure else "stopped")
        )


def _stop(streams: list[Stream], echo: Callable[[str], None], using: str, on_progress) -> None:
    """Stop the queries; a JVM that is already gone (its process group was signalled too)
    loses nothing: the checkpoint replays any unfinished batch on the next start."""
    for stream in streams:
        if stream.query is None:
            continue
        try:
            if stream.query.isActive:
                stream.query.stop()
            _report(stream, echo, using, on_progress)
        except Exception as exc:
            echo(f"{stream.spec.name}: Spark had stopped already ({session.first_line(exc)})")


def _check_dataset(stream: Stream) -> None:
    """A dataset written by batch runs cannot take a streaming sink: Spark would then read the
    directory through the sink's log only, and ignore the batch files."""
    files = output.parquet_files(stream.path)
    if files and output.sink_files(stream.path) is None:
        raise errors.ExportError(
            f"export: {stream.path} holds a dataset written by batch exports; give --follow an "
            "output of its own"
        )


def _warm_up(spark: Any, stream: Stream, checkpoint: str) -> None:
    """Export an empty key range through the source before the queries start: the first read
    starts the executors' Python workers (pyarrow, psycopg), Spark's Arrow path and its Parquet
    writer, seconds that would otherwise delay the first micro-batch's rows. The empty dataset
    goes under the checkpoint directory (shared storage on a cluster) and is overwritten on
    the next start."""
    empty = dataclasses.replace(stream.read, ranges=((0, -1),), transaction_range=None)
    frame = spark.read.format(spark_source.FORMAT).options(**empty.to_options()).load()
    frame.write.mode("overwrite").parquet(output.join(checkpoint, WARM_UP))


def _start(spark: Any, stream: Stream, trigger_seconds: float) -> Any:
    frame = spark.readStream.format(spark_source.FORMAT).options(**stream.read.to_options()).load()
    writer = (
        frame.writeStream.format("parquet")
        .queryName(f"pgmsg_{stream.spec.name}")
        .option("path", stream.path)
        .option("checkpointLocation", stream.checkpoint)
        .outputMode("append")
        .trigger(processingTime=f"{trigger_seconds} seconds")
    )
    if stream.partition_column:
        writer = writer.partitionBy(stream.partition_column)
    return writer.start()


def _report(stream: Stream, echo: Callable[[str], None], using: str, on_progress=None) -> None:
    for spark_progress in stream.query.recentProgress:
        batch = spark_progress["batchId"]
        if batch <= stream.reported:
            continue
        stream.reported = batch
        rows = spark_progress["numInputRows"]
        if not rows and batch > 0:
            continue  # an idle trigger: nothing to say
        [src] = spark_progress["sources"]
        end = json.loads(src["endOffset"]) if src.get("endOffset") else None
        behind_rows, behind_seconds = lag(stream, end, using=using)
        duration = spark_progress["durationMs"].get("triggerExecution", 0) / 1000
        progress = Progress(
            table=stream.spec.name,
            batch=batch,
            rows=rows,
            seconds=duration,
            end=end,
            behind_rows=behind_rows,
            behind_seconds=behind_seconds,
        )
        echo(progress.describe())
        if on_progress is not None:
            on_progress(progress)


def lag(stream: Stream, end: dict | None, *, using: str) -> tuple[int, float]:
    """Rows after checkpoint ``end`` (committed or not) and the age of the oldest of them."""
    end = end or spark_source.offset(0, 0)
    query = pgsql.SQL(QUERIES["lag"]).format(
        table=pgsql.Identifier(stream.spec.table),
        key=pgsql.Identifier(stream.spec.key),
        transaction=pgsql.Identifier(stream.spec.transaction_column),
        timestamp=pgsql.Identifier(stream.spec.timestamp),
    )
    with connections[using].cursor() as cursor:
        cursor.execute(
            query.as_string(cursor.connection),
            {"end_tx": str(end["transaction_id"]), "end_key": end["position"]},
        )
        rows, age = cursor.fetchone()
    return rows, age or 0.0


class _signals:
    """SIGTERM and SIGINT set ``stop``: the queries stop between micro-batches' files."""

    def __init__(self, stop: threading.Event, install: bool) -> None:
        self.stop = stop
        self.install = install
        self.previous: dict = {}

    def __enter__(self) -> None:
        if self.install:
            for signum in (signal.SIGTERM, signal.SIGINT):
                self.previous[signum] = signal.signal(signum, lambda *_: self.stop.set())

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
