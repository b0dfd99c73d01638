"""Parquet written by the read tasks themselves (pyarrow), committed by the driver.

A batch export to a local (or shared, mounted) path runs each read partition as a plain Spark
task (``parallelize(...).mapPartitions``) that COPYs its key range and writes the rows with
pyarrow's Parquet writer where it read them: the rows never cross into the JVM (Spark's own
writer converted every row to an ``InternalRow`` and encoded it with parquet-mr, about a third
of the export's time). Each task attempt writes under its own staging directory and returns
its files; the driver moves only the files of the attempts Spark reports as successful into
the dataset, so a retried, speculative or killed attempt never leaves a duplicate. The layout
is Spark's: ``<column>=<value>/part-....parquet``, values escaped as Spark escapes them.

Like :mod:`pgmsg.export.reading`, this module runs on executors without Django or pgmsg: it is
shipped by value (:func:`pgmsg.export.session.prepare`) and needs only the reading module, pyarrow
and pyspark there.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import shutil
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# Names, not the module: cloudpickle then ships these functions by value, not all of reading.
from pgmsg.export.reading import ReadPlan, SourceError, read_range

#: Bytes of Arrow data gathered per output file before they are written as one row group:
#: fewer, larger row groups read faster, as Spark's writer makes them.
ROW_GROUP_BYTES = 64 * 1024 * 1024
#: Most output files a task keeps open at once (one per partition value it meets); the least
#: recently used is closed beyond that, and a later row of its value starts a new file.
MAX_OPEN_FILES = 32
#: Most seconds to wait for a finished job's leftover tasks before staging is removed.
SETTLE_SECONDS = 60.0
#: Spark's name for a NULL or empty partition value (pyarrow's hive partitioning reads it too).
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
# The characters Spark escapes in partition directory names (ExternalCatalogUtils), as %XX.
_ESCAPED = frozenset([chr(c) for c in range(0x20)] + list("\"#%'*/:=?\\\x7f{[]^"))
#: The marker Spark's committer writes into a dataset after a successful job.
SUCCESS = "_SUCCESS"


@dataclasses.dataclass(frozen=True)
class WriteJob:
    """What every task of one dataset write needs (pickled to the executors)."""

    options: dict[str, str]
    staging: str
    partition_column: str | None
    run: str

    @property
    def plan(self) -> ReadPlan:
        return ReadPlan.from_options(self.options)


def partition_dir(column: str, value: Any) -> str:
    """``column=value`` as Spark names a partition directory."""
    if value is None or value == "":
        return f"{column}={NULL_PARTITION}"
    if isinstance(value, dt.date):
        text = value.isoformat()
    elif isinstance(value, bool):
        text = str(value).lower()
    else:
        text = str(value)
    return f"{column}=" + "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in text)


def _split(batch: pa.RecordBatch, column: str) -> Iterator[tuple[Any, pa.RecordBatch]]:
    """The rows of ``batch`` grouped by ``column``'s value (without that column)."""
    values = batch.column(column)
    rest = batch.select([name for name in batch.schema.names if name != column])
    if len(values) and values.null_count in (0, len(values)):
        first = values[0].as_py()
        if values.null_count or pc.all(pc.equal(values, values[0])).as_py():
            yield first, rest  # the usual case for day: one value per batch
            return
    order = pc.sort_indices(values)  # NULLs last
    values = values.take(order)
    rest = rest.take(order)
    runs = pc.run_end_encode(values)
    start = 0
    for end, value in zip(runs.run_ends.to_pylist(), runs.values.to_pylist(), strict=True):
        yield value, rest.slice(start, end - start)
        start = end


class _Output:
    """The open Parquet file (and the rows not yet written to it) of one partition value."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.path = path
        self.schema = schema
        self.writer: pq.ParquetWriter | None = None
        self.pending: list[pa.RecordBatch] = []
        self.pending_bytes = 0
        self.rows = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self.pending.append(batch)
        self.pending_bytes += batch.nbytes
        self.rows += batch.num_rows
        if self.pending_bytes >= ROW_GROUP_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        if self.writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(self.path, self.schema, compression="snappy")
        self.writer.write_table(pa.Table.from_batches(self.pending, schema=self.schema))
        self.pending, self.pending_bytes = [], 0

    def close(self) -> None:
        self.flush()
        if self.writer is not None:
            self.writer.close()


def write_batches(
    job: WriteJob, batches: Iterable[pa.RecordBatch], directory: Path, task: int
) -> list[tuple[str, int]]:
    """Write ``batches`` as Parquet under ``directory``; (path relative to it, rows) per file."""
    schema = job.plan.arrow_schema()
    column = job.partition_column
    data_schema = schema.remove(schema.get_field_index(column)) if column else schema
    outputs: OrderedDict[str, _Output] = OrderedDict()
    written: list[tuple[str, int]] = []
    counter = 0

    def close(key: str) -> None:
        out = outputs.pop(key)
        out.close()
        written.append((str(out.path.relative_to(directory)), out.rows))

    for batch in batches:
        groups = _split(batch, column) if column else [(None, batch)]
        for value, rows in groups:
            key = partition_dir(column, value) if column else ""
            if key not in outputs:
                if len(outputs) >= MAX_OPEN_FILES:
                    close(next(iter(outputs)))
                name = f"part-{task:05d}-{job.run}-c{counter:03d}.snappy.parquet"
                counter += 1
                outputs[key] = _Output(directory / key / name, data_schema)
            outputs.move_to_end(key)
            outputs[key].add(rows)
    for key in list(outputs):
        close(key)
    return written


def write_task(job: WriteJob, items: Iterable[tuple[int, tuple[int, int]]]) -> Iterator[dict]:
    """One Spark task: read its key range and write it, in a directory of its own attempt."""
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = f"{context.partitionId()}-{context.attemptNumber()}" if context else "driver"
    directory = Path(job.staging) / f"attempt-{attempt}"
    plan = job.plan
    for task, (lo, hi) in items:
        try:
            files = write_batches(job, read_range(plan, lo, hi), directory, task)
        except OSError as exc:
            raise SourceError(
                f"pgmsg source: writing {plan.table} rows as Parquet under {directory} failed "
                f"on this executor: {exc}"
            ) from None
        yield {"directory": str(directory), "files": files}


def write_dataset(
    spark: Any,
    plan: ReadPlan,
    path: Path,
    *,
    partition_column: str | None,
    overwrite: bool,
) -> None:
    """Write the rows of ``plan`` to the dataset at ``path`` with one task per key range, and
    commit the files of the successful attempts. Nothing is visible to readers before the
    commit; a failure removes the staging files and leaves the dataset as it was."""
    run = uuid.uuid4().hex[:16]
    staging = path / f"_pgmsg_staging-{run}"
    # The highest directory this write creates: removed again (when empty) if it fails.
    created = None if path.exists() else path
    while created is not None and not created.parent.exists():
        created = created.parent
    job = WriteJob(plan.to_options(), str(staging), partition_column, run)
    context = spark.sparkContext
    group = f"pgmsg-export-{run}"
    try:
        results = []
        if plan.ranges:
            ranges = list(enumerate(plan.ranges))
            context.setJobGroup(group, f"pgmsg export of {plan.table}", interruptOnCancel=True)
            try:
                rdd = context.parallelize(ranges, len(ranges))
                results = rdd.mapPartitions(partial(write_task, job)).collect()
            finally:
                _settle(context, group)
        _commit(path, staging, results, overwrite=overwrite, job=job)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for directory in (path, *path.parents) if created is not None else ():
            if not directory.is_dir() or any(directory.iterdir()):
                break
            directory.rmdir()
            if directory == created:
                break
        raise
    shutil.rmtree(staging, ignore_errors=True)


def _settle(context: Any, group: str) -> None:
    """Cancel what is left of the job group and wait (bounded) until none of its tasks runs:
    a failed job's other tasks, or a speculative copy, could still write into staging."""
    context.cancelJobGroup(group)
    tracker = context.statusTracker()
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        stages = [
            stage
            for job in tracker.getJobIdsForGroup(group)
            if (info := tracker.getJobInfo(job)) is not None
            for stage in info.stageIds
        ]
        infos = [tracker.getStageInfo(stage) for stage in stages]
        if not any(info is not None and info.numActiveTasks for info in infos):
            return
        time.sleep(0.1)


def _commit(path: Path, staging: Path, results: list[dict], *, overwrite: bool, job: WriteJob):
    """Move the files the successful attempts listed into the dataset (other attempts' files
    stay in staging, which is then removed), replacing its contents when ``overwrite``."""
    path.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for entry in path.iterdir():
            if entry == staging:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    moved = 0
    for result in results:
        for relative, _rows in result["files"]:
            target = path / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(Path(result["directory"]) / relative, target)
            moved += 1
    if not moved and not job.partition_column:
        # As Spark does for an empty unpartitioned write: one file that carries the schema.
        name = f"part-00000-{job.run}-c000.snappy.parquet"
        pq.write_table(job.plan.arrow_schema().empty_table(), path / name, compression="snappy")
    (path / SUCCESS).touch()
