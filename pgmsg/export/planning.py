"""Planning a run: which rows of each table, in which read partitions, written how and where.

Everything is decided before Spark starts, from one read horizon (pgmsg/core/horizon.py),
and every option is validated here, so a bad option fails before anything is read or created.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import psycopg
from django.db import DatabaseError, connections
from psycopg import sql as pgsql

from pgmsg.core import conf, errors, horizon, sql
from pgmsg.export import output, reading, tables, watermarks
from pgmsg.export.choices import MODES, PARTITION_BY

QUERIES = sql.load(__package__, "export.sql")


@dataclasses.dataclass
class TablePlan:
    """What a run will export of one table (all of it decided before Spark starts)."""

    spec: tables.TableSpec
    path: str
    mode: str
    partition_column: str | None
    read: reading.ReadPlan
    rows: int
    key_range: tuple[int, int] | None
    #: (previous watermark, new watermark) for incremental tables.
    transaction_range: tuple[int, int] | None

    @property
    def writes(self) -> bool:
        """Whether the run writes files (rows to append, or a dataset to overwrite)."""
        return bool(self.rows) or self.mode == "overwrite"

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


def check_options(*, partitions: int | None, partition_by: str, mode: str | None) -> None:
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


def check_fields(flatten: Iterable[str]) -> tuple[str, ...]:
    fields = tuple(f.strip() for f in flatten if f.strip())
    for field in fields:
        if not tables.NAME_RE.match(field):
            raise errors.ExportError(
                f"export: cannot flatten payload field {field!r}: give top-level field names "
                "made of letters, digits and underscores"
            )
    return fields


def plan(
    output_path: str,
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
    """Decide what each table's export reads, from one read horizon; validates every option."""
    using = using or conf.get().DATABASE
    check_options(partitions=partitions, partition_by=partition_by, mode=mode)
    flatten = check_fields(flatten)
    conninfo = database_url or conninfo_of(using)
    try:
        specs = select_tables(tables, using)
        with connections[using].cursor() as cursor:
            # Every transaction below it that could write this database has ended, so the rows
            # below it can no longer change; transactions of other databases do not hold it
            # back. The tables are read in later statements, as horizon() requires.
            xmin = horizon.horizon(cursor)
            return [
                _plan_table(
                    cursor,
                    spec,
                    output_path=output_path,
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


def select_tables(names: Sequence[str] | None, using: str) -> list[tables.TableSpec]:
    """The specs of ``names`` (default: every registered table that exists), validated."""
    registry = tables.registered()
    if names is not None:
        unknown = [t for t in names if t not in registry]
        if unknown:
            raise errors.ExportError(
                f"export: unknown table(s) {unknown}; registered: {sorted(registry)}"
            )
    with connections[using].cursor() as cursor:
        present = {name for name, spec in registry.items() if _table_exists(cursor, spec.table)}
    if names is None:
        return [spec for name, spec in sorted(registry.items()) if name in present]
    missing = [t for t in names if t not in present]
    if missing:
        raise errors.ExportError(
            f"export: table(s) {missing} not found in the database: run `manage.py migrate`"
        )
    return [registry[t] for t in dict.fromkeys(names)]


def columns_of(cursor, spec: tables.TableSpec) -> dict[str, str]:
    """The table's columns and their PostgreSQL types, in order."""
    cursor.execute(QUERIES["table_columns"], {"table": spec.table})
    return {name: db_type for name, db_type in cursor.fetchall()}


def kind(db_type: str) -> str:
    """How the data source reads a column of this PostgreSQL type (see reading._KINDS)."""
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


def read_columns(
    cursor, spec: tables.TableSpec, *, partition_by: str, flatten: Sequence[str]
) -> tuple[list[reading.Column], str | None]:
    """The columns a read of ``spec`` produces, and the output partition column."""
    db_columns = columns_of(cursor, spec)
    columns = [reading.Column(name, kind(db_type), name) for name, db_type in db_columns.items()]
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
            columns.append(reading.Column(name, "field", spec.payload_column, field))
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
        columns.append(reading.Column("day", "day", spec.timestamp))
    return columns, partition_column


def _table_exists(cursor, table: str) -> bool:
    cursor.execute(QUERIES["table_exists"], {"table": table})
    return cursor.fetchone()[0]


def _plan_table(
    cursor,
    spec: tables.TableSpec,
    *,
    output_path: str,
    xmin: int,
    partitions: int | None,
    partition_by: str,
    mode: str | None,
    full: bool,
    flatten: Sequence[str],
    conninfo: str,
    using: str,
) -> TablePlan:
    columns, partition_column = read_columns(
        cursor, spec, partition_by=partition_by, flatten=flatten
    )
    identifiers = {"key": pgsql.Identifier(spec.key), "table": pgsql.Identifier(spec.table)}
    transaction_range = None
    params: dict = {}
    if spec.incremental:
        previous = 0 if full else (watermarks.watermark(spec.name, using=using) or 0)
        transaction_range = (previous, max(previous, xmin))
        query = pgsql.SQL(QUERIES["key_range_between"]).format(
            transaction=pgsql.Identifier(spec.transaction_column), **identifiers
        )
        params = {"lower": str(transaction_range[0]), "upper": str(transaction_range[1])}
    else:
        query = pgsql.SQL(QUERIES["key_range"]).format(**identifiers)
    cursor.execute(query.as_string(cursor.connection), params)
    rows, lo, hi = cursor.fetchone()
    parts = partitions or max(1, math.ceil(rows / conf.get().EXPORT_ROWS_PER_PARTITION))
    ranges = tuple(reading.split_range(lo, hi, parts)) if rows else ()
    read = reading.ReadPlan(
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
        path=output.join(output_path, spec.name),
        mode=mode or ("overwrite" if full or not spec.incremental else "append"),
        partition_column=partition_column,
        read=read,
        rows=rows,
        key_range=(lo, hi) if rows else None,
        transaction_range=transaction_range,
    )


def conninfo_of(using: str) -> str:
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
