"""Export pgmsg's tables to Parquet with Spark: plan ranges, read in parallel, move watermarks.

Each registered table becomes one Parquet dataset, ``<output>/<name>``. Tables with a
``transaction_id xid8`` column are exported incrementally and gap-free: a run reads only
rows whose transaction id is below ``pg_snapshot_xmin(pg_current_snapshot())`` taken when
the run starts (every transaction below it has committed or aborted, so that set of rows can
no longer change), and at least the previous run's xmin. That xmin becomes the table's
watermark once its dataset is written, so a transaction that commits late is exported by the
next run instead of being skipped. Tables without it are exported whole (a snapshot).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
from django.db import DatabaseError, connections, transaction
from django.db.models.functions import Now
from psycopg import sql as pgsql

from pgmsg import conf, errors
from pgmsg.spark_source import FORMAT, Column, ReadPlan

logger = logging.getLogger(__name__)

PARTITION_BY = ("day", "type", "category", "none")
MODES = ("append", "overwrite")
_FIELD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_LOCK_NAMESPACE = "pgmsg_export:"


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """How one table is exported. Its columns are read from the database catalog."""

    #: Dataset name: the directory under the output path and the watermark's key.
    name: str
    table: str
    #: Unique, increasing integer column: split into ranges, one per Spark partition.
    key: str
    #: Its UTC day is the default output partition.
    timestamp: str
    type_column: str | None = None
    category_column: str | None = None
    #: JSON column whose top-level fields ``flatten`` may copy into columns of their own.
    payload_column: str | None = None
    #: An xid8 column set to pg_current_xact_id() on insert; None exports snapshots.
    transaction_column: str | None = None

    @property
    def incremental(self) -> bool:
        return self.transaction_column is not None


_REGISTRY: dict[str, TableSpec] = {}


def register(spec: TableSpec) -> TableSpec:
    """Add (or replace) a table spec; later message tables register themselves here."""
    if not _FIELD_RE.match(spec.name):
        raise errors.ConfigurationError(f"export dataset name {spec.name!r} is not a plain name")
    _REGISTRY[spec.name] = spec
    return spec


def registered() -> dict[str, TableSpec]:
    return dict(_REGISTRY)


register(
    TableSpec(
        name="events",
        table="pgmsg_event",
        key="position",
        timestamp="recorded_at",
        type_column="type",
        category_column="category",
        payload_column="data",
        transaction_column="transaction_id",
    )
)
register(
    TableSpec(
        name="inbox_messages",
        table="pgmsg_inbox_message",
        key="id",
        timestamp="received_at",
        type_column="type",
        category_column="inbox",
        payload_column="payload",
        transaction_column="transaction_id",
    )
)
# Handled notifications are deleted, so this table only ever holds pending, retrying and dead
# rows and has no transaction id: each run exports what is there now.
register(
    TableSpec(
        name="notifications",
        table="pgmsg_notification",
        key="id",
        timestamp="created_at",
        type_column="channel",
        payload_column="payload",
    )
)


@dataclasses.dataclass
class TablePlan:
    """What a run will export of one table (all of it decided before Spark starts)."""

    spec: TableSpec
    path: str
    mode: str
    partition_column: str | None
    read: ReadPlan
    rows: int
    key_range: tuple[int, int] | None
    #: (previous watermark, new watermark) for incremental tables.
    transaction_range: tuple[int, int] | None

    def describe(self) -> str:
        what = f"{self.rows} row(s)"
        if self.key_range:
            what += f", {self.spec.key} {self.key_range[0]}..{self.key_range[1]}"
        if self.transaction_range:
            lo, hi = self.transaction_range
            what += f", transaction_id >= {lo} and < {hi}"
        else:
            what += ", snapshot of the whole table"
        ranges = ", ".join(f"{lo}..{hi}" for lo, hi in self.read.ranges) or "none"
        part = self.partition_column or "none"
        return (
            f"{self.spec.name} ({self.spec.table}): {what}; {len(self.read.ranges)} read "
            f"partition(s) [{ranges}]; {self.mode} to {self.path} partitioned by {part}"
        )


@dataclasses.dataclass
class TableResult:
    name: str
    rows: int
    #: Parquet files and bytes this run wrote (None when the output is not a local path).
    files: int | None
    bytes: int | None
    seconds: float
    watermark: int | None


@dataclasses.dataclass
class ExportSummary:
    plans: list[TablePlan]
    results: list[TableResult]
    spark_seconds: float = 0.0
    seconds: float = 0.0
    dry_run: bool = False

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.results)


def export_tables(
    output: str,
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
) -> ExportSummary:
    """Export ``tables`` (default: every registered table that exists) under ``output``.

    ``mode`` defaults to append for incremental tables and to overwrite for snapshot tables
    and ``full`` re-exports. Executors connect with ``database_url`` when given, else with
    the Django database's parameters. A table's watermark moves only after its dataset has
    been written; any failure raises :class:`errors.ExportError` and leaves it in place.
    """
    echo = echo or logger.info
    started = time.monotonic()
    using = using or conf.get().DATABASE
    _check_options(partitions=partitions, partition_by=partition_by, mode=mode)
    fields = _check_fields(flatten)
    with _locked(using):
        plans = plan(
            output,
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
            _check_output(output)
        for table_plan in plans:
            echo(("would export " if dry_run else "exporting ") + table_plan.describe())
        summary = ExportSummary(plans=plans, results=[], dry_run=dry_run)
        if dry_run:
            summary.seconds = time.monotonic() - started
            return summary
        if spark is None and any(p.rows or p.mode == "overwrite" for p in plans):
            spark_started = time.monotonic()
            spark = start_spark(master or conf.get().EXPORT_SPARK_MASTER, spark_conf or {})
            summary.spark_seconds = time.monotonic() - spark_started
            echo(f"Spark started in {summary.spark_seconds:.1f}s ({spark.sparkContext.master})")
        for table_plan in plans:
            result = _export_one(spark, table_plan, using=using)
            summary.results.append(result)
            echo(
                f"{result.name}: {result.rows} row(s), {_maybe(result.files)} file(s), "
                f"{_maybe(result.bytes)} byte(s) in {result.seconds:.1f}s"
                + (f"; watermark {result.watermark}" if result.watermark is not None else "")
            )
    summary.seconds = time.monotonic() - started
    return summary


def plan(
    output: str,
    *,
    tables: Sequence[str] | None = None,
    partitions: int | None = None,
    partition_by: str = "day",
    mode: str | None = None,
    full: bool = False,
    flatten: Sequence[str] = (),
    database_url: str | None = None,
    using: str | None = None,
) -> list[TablePlan]:
    """Decide what each table's export reads, from one snapshot xmin; validates every option."""
    using = using or conf.get().DATABASE
    conninfo = database_url or _conninfo(using)
    try:
        specs = _select_tables(tables, using)
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
            xmin = cursor.fetchone()[0]
            return [
                _plan_table(
                    cursor,
                    spec,
                    output=output,
                    xmin=xmin,
                    partitions=partitions,
                    partition_by=partition_by,
                    mode=mode,
                    full=full,
                    flatten=flatten,
                    conninfo=conninfo,
                    using=using,
                )
                for spec in specs
            ]
    except DatabaseError as exc:
        raise errors.ExportError(f"export: cannot read from database {using!r}: {exc}") from exc


def watermark(name: str, *, using: str | None = None) -> int | None:
    """The transaction-id watermark of dataset ``name`` (None before its first export)."""
    from pgmsg.models import ExportWatermark

    row = ExportWatermark.objects.using(using or conf.get().DATABASE).filter(name=name).first()
    return row.transaction_xmin if row else None


def java_command() -> str:
    """The java executable Spark will use; JavaMissing says what to install when there is none."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
        raise errors.JavaMissing(
            f"JAVA_HOME is {java_home!r} but {candidate} is not an executable: point JAVA_HOME "
            "at a Java 17 (or later) installation, or unset it to use java from PATH"
        )
    found = shutil.which("java")
    if not found:
        raise errors.JavaMissing(
            "pgmsg_export runs on Spark, which needs Java 17 or later and found no `java` on "
            "PATH: install a JDK or JRE 17+ (e.g. `apt-get install openjdk-17-jre-headless`, "
            "`brew install openjdk@17`) or set JAVA_HOME"
        )
    return found


def start_spark(master: str, spark_conf: dict[str, str] | None = None) -> Any:
    """A SparkSession on ``master`` (``local[*]``, ``spark://...``, ``yarn``, ...)."""
    java_command()
    # Spark's Python workers must run this interpreter, where pgmsg and psycopg are installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("pgmsg-export").master(master)
    builder = builder.config("spark.ui.showConsoleProgress", str(sys.stderr.isatty()).lower())
    for key, value in (spark_conf or {}).items():
        builder = builder.config(key, value)
    try:
        return builder.getOrCreate()
    except Exception as exc:
        raise errors.ExportError(f"export: Spark did not start on {master!r}: {exc}") from exc


def split_range(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous inclusive ranges covering lo..hi (fewer when the range is short)."""
    parts = max(1, min(parts, hi - lo + 1))
    step = (hi - lo + 1) / parts
    bounds = [lo + round(i * step) for i in range(parts)] + [hi + 1]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(parts)]


# -- planning -------------------------------------------------------------------------------


def _check_options(*, partitions: int | None, partition_by: str, mode: str | None) -> None:
    if partitions is not None and (not isinstance(partitions, int) or partitions < 1):
        raise errors.ExportError(
            f"export: partitions must be a positive integer, got {partitions!r}"
        )
    if partition_by not in PARTITION_BY:
        raise errors.ExportError(
            f"export: partition_by must be one of {PARTITION_BY}, got {partition_by!r}"
        )
    if mode is not None and mode not in MODES:
        raise errors.ExportError(f"export: mode must be one of {MODES}, got {mode!r}")


def _check_fields(flatten: Iterable[str]) -> tuple[str, ...]:
    fields = tuple(f.strip() for f in flatten if f.strip())
    for field in fields:
        if not _FIELD_RE.match(field):
            raise errors.ExportError(
                f"export: cannot flatten payload field {field!r}: give top-level field names "
                "made of letters, digits and underscores"
            )
    return fields


def _select_tables(tables: Sequence[str] | None, using: str) -> list[TableSpec]:
    with connections[using].cursor() as cursor:
        present = {name for name, spec in _REGISTRY.items() if _table_exists(cursor, spec.table)}
    if tables is None:
        return [spec for name, spec in sorted(_REGISTRY.items()) if name in present]
    unknown = [t for t in tables if t not in _REGISTRY]
    if unknown:
        raise errors.ExportError(
            f"export: unknown table(s) {unknown}; registered: {sorted(_REGISTRY)}"
        )
    missing = [t for t in tables if t not in present]
    if missing:
        raise errors.ExportError(
            f"export: table(s) {missing} not found in the database: run `manage.py migrate`"
        )
    return [_REGISTRY[t] for t in dict.fromkeys(tables)]


def _table_exists(cursor, table: str) -> bool:
    cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [table])
    return cursor.fetchone()[0]


def _kind(db_type: str) -> str:
    if db_type in ("bigint",):
        return "int64"
    if db_type in ("integer", "smallint"):
        return "int32"
    if db_type in ("double precision", "real"):
        return "float64"
    if db_type in ("json", "jsonb"):
        return "json"
    if db_type.startswith("timestamp"):
        return "timestamp"
    return {"boolean": "bool", "xid8": "xid8", "date": "date"}.get(db_type, "text")


def _table_columns(cursor, table: str) -> dict[str, str]:
    cursor.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        [table],
    )
    return {name: db_type for name, db_type in cursor.fetchall()}


def _plan_table(
    cursor,
    spec: TableSpec,
    *,
    output: str,
    xmin: int,
    partitions: int | None,
    partition_by: str,
    mode: str | None,
    full: bool,
    flatten: Sequence[str],
    conninfo: str,
    using: str,
) -> TablePlan:
    db_columns = _table_columns(cursor, spec.table)
    columns = [Column(name, _kind(db_type), name) for name, db_type in db_columns.items()]
    for role, column in (
        ("ordering key", spec.key),
        ("timestamp", spec.timestamp),
        ("transaction id", spec.transaction_column),
    ):
        if column is not None and column not in db_columns:
            raise errors.ExportError(
                f"export: {spec.name}: {role} column {column!r} is not a column of {spec.table}"
            )
    if flatten:
        if spec.payload_column is None:
            raise errors.ExportError(f"export: {spec.name} has no payload column to flatten")
        for field in flatten:
            name = f"{spec.payload_column}_{field}"
            if name in db_columns:
                raise errors.ExportError(
                    f"export: {spec.name}: flattened field {field!r} would be named {name!r}, "
                    "which is already a column"
                )
            columns.append(Column(name, "field", spec.payload_column, field))
    partition_column = {
        "day": "day",
        "type": spec.type_column,
        "category": spec.category_column,
        "none": None,
    }[partition_by]
    if partition_by in ("type", "category") and partition_column is None:
        raise errors.ExportError(
            f"export: {spec.name} has no {partition_by} column to partition by; choose "
            f"another --partition-by or leave {spec.name} out with --tables"
        )
    if partition_by == "day":
        if "day" in db_columns:
            raise errors.ExportError(f"export: {spec.name} already has a column named 'day'")
        columns.append(Column("day", "day", spec.timestamp))

    key = pgsql.Identifier(spec.key)
    query = pgsql.SQL("SELECT count(*), min({k})::bigint, max({k})::bigint FROM {t}").format(
        k=key, t=pgsql.Identifier(spec.table)
    )
    transaction_range = None
    params: list = []
    if spec.incremental:
        previous = 0 if full else (watermark(spec.name, using=using) or 0)
        transaction_range = (previous, max(previous, xmin))
        query = pgsql.SQL("{q} WHERE {tx} >= %s::text::xid8 AND {tx} < %s::text::xid8").format(
            q=query, tx=pgsql.Identifier(spec.transaction_column)
        )
        params = [str(transaction_range[0]), str(transaction_range[1])]
    cursor.execute(query.as_string(cursor.connection), params)
    rows, lo, hi = cursor.fetchone()
    parts = partitions or max(1, math.ceil(rows / conf.get().EXPORT_ROWS_PER_PARTITION))
    ranges = tuple(split_range(lo, hi, parts)) if rows else ()
    read = ReadPlan(
        conninfo=conninfo,
        table=spec.table,
        key=spec.key,
        columns=tuple(columns),
        ranges=ranges,
        transaction_column=spec.transaction_column,
        transaction_range=transaction_range,
    )
    return TablePlan(
        spec=spec,
        path=_join(output, spec.name),
        mode=mode or ("overwrite" if full or not spec.incremental else "append"),
        partition_column=partition_column,
        read=read,
        rows=rows,
        key_range=(lo, hi) if rows else None,
        transaction_range=transaction_range,
    )


def _conninfo(using: str) -> str:
    """A libpq connection string for executors, from the Django database's settings."""
    settings_dict = connections[using].settings_dict
    params = {
        "dbname": settings_dict.get("NAME") or None,
        "user": settings_dict.get("USER") or None,
        "password": settings_dict.get("PASSWORD") or None,
        "host": settings_dict.get("HOST") or None,
        "port": str(settings_dict.get("PORT") or "") or None,
    }
    for key, value in (settings_dict.get("OPTIONS") or {}).items():
        if isinstance(value, str | int) and key not in ("isolation_level", "server_side_binding"):
            params[key] = value
    return psycopg.conninfo.make_conninfo(**{k: v for k, v in params.items() if v is not None})


# -- running --------------------------------------------------------------------------------


def _export_one(spark: Any, table_plan: TablePlan, *, using: str) -> TableResult:
    started = time.monotonic()
    spec = table_plan.spec
    before = _parquet_files(table_plan.path)
    if table_plan.rows or table_plan.mode == "overwrite":
        try:
            _write(spark, table_plan)
        except Exception as exc:
            raise errors.ExportError(
                f"export: writing {spec.name} to {table_plan.path} failed; its watermark is "
                f"unchanged: {_first_line(exc)}"
            ) from exc
    new_watermark = table_plan.transaction_range[1] if table_plan.transaction_range else None
    _save_watermark(spec.name, new_watermark, table_plan.rows, using=using)
    files = rows = size = None
    after = _parquet_files(table_plan.path)
    if after is not None:
        new = sorted(set(after) - set(before or {}))
        files, size = len(new), sum(after[f] for f in new)
        rows = sum(_parquet_rows(f) for f in new)
    return TableResult(
        name=spec.name,
        rows=table_plan.rows if rows is None else rows,
        files=files,
        bytes=size,
        seconds=time.monotonic() - started,
        watermark=new_watermark,
    )


def _write(spark: Any, table_plan: TablePlan) -> None:
    from pgmsg.spark_source import PgmsgDataSource

    spark.dataSource.register(PgmsgDataSource)
    # Parquet's own UTC timestamp type (not the legacy INT96), readable by any Parquet reader.
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    spark.sparkContext.setJobDescription(f"pgmsg export {table_plan.spec.name}")
    if table_plan.rows:
        frame = spark.read.format(FORMAT).options(**table_plan.read.to_options()).load()
    else:  # overwriting with nothing: the dataset becomes empty (a snapshot of an empty table)
        frame = spark.createDataFrame([], table_plan.read.spark_schema())
    writer = frame.write.mode(table_plan.mode)
    if table_plan.partition_column:
        writer = writer.partitionBy(table_plan.partition_column)
    writer.parquet(table_plan.path)


def _save_watermark(name: str, xmin: int | None, rows: int, *, using: str) -> None:
    from pgmsg.models import ExportWatermark

    with transaction.atomic(using=using):
        row, _ = ExportWatermark.objects.using(using).select_for_update().get_or_create(name=name)
        row.transaction_xmin = xmin
        row.last_rows = rows
        row.total_rows += rows
        row.exported_at = Now()
        row.save(using=using)


class _locked:
    """A session advisory lock per run, so two exports never read the same range twice."""

    def __init__(self, using: str) -> None:
        self.using = using

    def __enter__(self) -> None:
        try:
            with connections[self.using].cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [_LOCK_NAMESPACE])
                got = cursor.fetchone()[0]
        except DatabaseError as exc:
            raise errors.ExportError(
                f"export: cannot reach database {self.using!r}: {exc}"
            ) from exc
        if not got:
            raise errors.ExportError(
                "export: another pgmsg export is running on this database; try again when it ends"
            )

    def __exit__(self, *exc_info) -> None:
        try:
            with connections[self.using].cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(hashtext(%s))", [_LOCK_NAMESPACE])
        except DatabaseError:
            logger.warning("export: could not release the export lock (connection lost?)")


# -- output paths ---------------------------------------------------------------------------


def _local_path(path: str) -> Path | None:
    scheme = urlsplit(path).scheme
    if scheme == "file":
        return Path(urlsplit(path).path)
    return Path(path) if not scheme or len(scheme) == 1 else None


def _join(output: str, name: str) -> str:
    return output.rstrip("/") + "/" + name


def _check_output(output: str) -> None:
    """Fail before reading anything when a local output directory cannot be written."""
    local = _local_path(output)
    if local is None:
        return  # hdfs://, s3a://, ...: Spark reports problems when it writes
    try:
        local.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=local, prefix=".pgmsg-export-probe"):
            pass
    except OSError as exc:
        raise errors.ExportError(f"export: output path {output!r} is not writable: {exc}") from exc


def _parquet_files(path: str) -> dict[str, int] | None:
    local = _local_path(path)
    if local is None:
        return None
    if not local.is_dir():
        return {}
    return {
        str(f): f.stat().st_size
        for f in local.rglob("*.parquet")
        if not any(part.startswith(("_", ".")) for part in f.relative_to(local).parts)
    }


def _parquet_rows(path: str) -> int:
    import pyarrow.parquet as pq

    return pq.read_metadata(path).num_rows


def _maybe(value: int | None) -> str:
    return "?" if value is None else str(value)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if "Error" in line or "Exception" in line:
            return line.strip()[:500]
    return (text.splitlines() or [type(exc).__name__])[0][:500]
