"""Reading pgmsg's tables for the export: read plans, and key ranges COPYed out of PostgreSQL.

Runs inside Spark's Python workers, on executors that have neither Django nor pgmsg: the
export registers this module to be pickled by value with the data source (pgmsg/export/
source.py), so it needs only pyspark, psycopg and pyarrow there. It imports nothing else of
pgmsg but the named-SQL loader, at import time on the driver (the statements travel as
values). Everything a read needs (connection string, table, columns, key ranges,
transaction-id bounds) arrives as data source options (:class:`ReadPlan`).

Each read COPYs its rows out of PostgreSQL as CSV and parses them with pyarrow block by
block, so rows reach Spark (or the task writer, pgmsg/export/files.py) as Arrow record batches.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pyarrow as pa
from psycopg import pq, sql
from pyarrow import csv as pacsv
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pgmsg.core import sql as named_sql

QUERIES = named_sql.load(__package__, "source.sql")

# How each kind of column is selected, parsed from CSV, and typed in Spark. Timestamps travel
# as integer microseconds since the epoch: exact, and free of any session time zone.
_KINDS: dict[str, tuple[str, pa.DataType, DataType]] = {
    "int64": ("{c}", pa.int64(), LongType()),
    "int32": ("{c}", pa.int32(), IntegerType()),
    "float64": ("{c}", pa.float64(), DoubleType()),
    "bool": ("{c}", pa.bool_(), BooleanType()),
    "text": ("{c}::text", pa.string(), StringType()),
    "json": ("{c}::text", pa.string(), StringType()),
    "xid8": ("{c}::text::bigint", pa.int64(), LongType()),
    "timestamp": ("(extract(epoch FROM {c}) * 1000000)::bigint", pa.int64(), TimestampType()),
    "date": ("to_char({c}, 'YYYY-MM-DD')", pa.date32(), DateType()),
    # Derived: the UTC day of a timestamp (the default output partition).
    "day": ("to_char({c} AT TIME ZONE 'UTC', 'YYYY-MM-DD')", pa.date32(), DateType()),
    # Derived: one top-level field of a JSON column, as text (JSON ->> semantics).
    "field": ("{c} ->> {f}", pa.string(), StringType()),
}
KINDS = frozenset(_KINDS)
_UTC_MICROS = pa.timestamp("us", tz="UTC")

#: Bytes of CSV gathered before parsing them into one Arrow batch.
DEFAULT_BLOCK_SIZE = 4 * 1024 * 1024
#: Rows per read partition of a streaming micro-batch.
DEFAULT_STREAM_ROWS_PER_PARTITION = 250_000


class SourceError(Exception):
    """A read failed on an executor; the message names the database without its password.

    (Executors have no pgmsg installed, so this cannot derive from pgmsg's errors; the export
    turns it into an ``ExportError`` on the driver.)
    """


@dataclass(frozen=True)
class Column:
    """One output column: ``kind`` of ``source`` (and ``field`` of it for kind "field")."""

    name: str
    kind: str
    source: str
    field: str | None = None

    def spark_type(self) -> DataType:
        return _KINDS[self.kind][2]

    def arrow_type(self) -> pa.DataType:
        return _UTC_MICROS if self.kind == "timestamp" else _KINDS[self.kind][1]

    def select(self) -> sql.Composable:
        template = _KINDS[self.kind][0]
        field = sql.Literal(self.field) if self.field is not None else sql.SQL("")
        return sql.SQL(template).format(c=sql.Identifier(self.source), f=field)


@dataclass(frozen=True)
class ReadPlan:
    """What one dataset read needs; serialised to a single data source option."""

    conninfo: str
    table: str
    key: str
    columns: tuple[Column, ...]
    #: Inclusive ranges of the ordering key, one per Spark partition.
    ranges: tuple[tuple[int, int], ...] = ()
    #: Only rows with lower <= transaction_column < upper (gap-free incremental reads).
    transaction_column: str | None = None
    transaction_range: tuple[int, int] | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    #: Streams: the starting checkpoint (transaction id, key) of a new query, the most rows per
    #: micro-batch (None: all available), rows per read partition.
    start: tuple[int, int] = (0, 0)
    max_rows_per_batch: int | None = None
    rows_per_partition: int = DEFAULT_STREAM_ROWS_PER_PARTITION

    def to_options(self) -> dict[str, str]:
        plan = {
            "table": self.table,
            "key": self.key,
            "columns": [[c.name, c.kind, c.source, c.field] for c in self.columns],
            "ranges": [list(r) for r in self.ranges],
            "transaction_column": self.transaction_column,
            "transaction_range": list(self.transaction_range) if self.transaction_range else None,
            "block_size": self.block_size,
            "start": list(self.start),
            "max_rows_per_batch": self.max_rows_per_batch,
            "rows_per_partition": self.rows_per_partition,
        }
        # An option key containing "url" is redacted by Spark (spark.sql.redaction.options.regex)
        # wherever it shows options, and the connection string may hold a password.
        return {"database_url": self.conninfo, "plan": json.dumps(plan)}

    @classmethod
    def from_options(cls, options: dict) -> ReadPlan:
        plan = json.loads(options["plan"])
        return cls(
            conninfo=options["database_url"],
            table=plan["table"],
            key=plan["key"],
            columns=tuple(Column(*c) for c in plan["columns"]),
            ranges=tuple((lo, hi) for lo, hi in plan["ranges"]),
            transaction_column=plan["transaction_column"],
            transaction_range=(
                tuple(plan["transaction_range"]) if plan["transaction_range"] else None
            ),
            block_size=plan["block_size"],
            start=tuple(plan.get("start") or (0, 0)),
            max_rows_per_batch=plan.get("max_rows_per_batch"),
            rows_per_partition=plan.get("rows_per_partition") or DEFAULT_STREAM_ROWS_PER_PARTITION,
        )

    def spark_schema(self) -> StructType:
        return StructType([StructField(c.name, c.spark_type(), True) for c in self.columns])

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.arrow_type()) for c in self.columns])

    def compose(self, name: str) -> sql.Composed:
        """The named statement with this plan's identifiers and column expressions."""
        return sql.SQL(QUERIES[name]).format(
            columns=sql.SQL(", ").join(c.select() for c in self.columns),
            table=sql.Identifier(self.table),
            key=sql.Identifier(self.key),
            transaction=sql.Identifier(self.transaction_column or self.key),
        )

    def copy_statement(self, lo: int, hi: int) -> tuple[sql.Composed, dict]:
        """COPY of one key range as CSV; bounds are parameters, names are identifiers."""
        params: dict = {"lo": lo, "hi": hi}
        if self.transaction_column and self.transaction_range:
            tx_lo, tx_hi = self.transaction_range
            params.update(tx_lo=str(tx_lo), tx_hi=str(tx_hi))
            return self.compose("copy_range_between"), params
        return self.compose("copy_range"), params


def redacted(conninfo: str) -> str:
    """The connection string as a postgresql:// URL without its password, to name it in errors."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "(an unparsable connection string)"
    params.pop("password", None)
    user = params.pop("user", "")
    host = params.pop("host", "")
    port = params.pop("port", "")
    dbname = params.pop("dbname", "")
    if host.startswith("/"):  # a Unix socket directory: a parameter, not a URL host
        params["host"], host = host, ""
    url = "postgresql://" + (f"{user}@" if user else "") + host + (f":{port}" if port else "")
    url += f"/{dbname}"
    if params:
        url += "?" + "&".join(f"{k}={v}" for k, v in sorted(params.items()))
    return url


def connect(conninfo: str) -> psycopg.Connection:
    """A read-only connection; a failure says which database could not be reached."""
    try:
        conn = psycopg.connect(conninfo, connect_timeout=10)
    except psycopg.OperationalError as exc:
        reason = " ".join(str(exc).split())
        raise SourceError(
            f"pgmsg source: cannot connect to PostgreSQL at {redacted(conninfo)!r} from this "
            f"executor: {reason}"
        ) from None
    conn.read_only = True
    return conn


def copy_rows(plan: ReadPlan, query: sql.Composed, params: dict) -> Iterator[pa.RecordBatch]:
    """Arrow batches of a COPY ... TO STDOUT (CSV), read over a connection of its own.

    COPY sends one row per message, so rows are gathered into blocks of about
    ``plan.block_size`` bytes that end on a row boundary (a row larger than that is a block of
    its own), and each block is parsed while PostgreSQL keeps sending. The rows are taken from
    libpq one C call each: psycopg's ``Copy.read()`` spent microseconds of Python per row (its
    wait loop and generators), the largest part of a read partition's own CPU time.
    """
    with connect(plan.conninfo) as conn:
        statement = psycopg.ClientCursor(conn).mogrify(query, params)
        pgconn = conn.pgconn
        _expect(plan, pgconn.exec_(statement.encode(conn.info.encoding)), pq.ExecStatus.COPY_OUT)
        block = bytearray()
        while True:
            nbytes, row = pgconn.get_copy_data(0)  # blocks until a row (or the end) arrives
            if nbytes < 0:
                break
            block += row
            if len(block) >= plan.block_size:
                yield from _parse(plan, block)
                block = bytearray()
        if nbytes == -2:
            _fail(plan, pgconn.get_error_message())
        # The COPY's own outcome (an error raised by a row is reported here).
        while (result := pgconn.get_result()) is not None:
            _expect(plan, result, pq.ExecStatus.COMMAND_OK)
        if block:
            yield from _parse(plan, block)


def _expect(plan: ReadPlan, result: pq.abc.PGresult, status: pq.ExecStatus) -> None:
    if result.status != status:
        _fail(plan, result.error_message)


def _fail(plan: ReadPlan, message: bytes) -> None:
    reason = " ".join(message.decode("utf-8", "replace").split()) or "no message from libpq"
    raise SourceError(
        f"pgmsg source: reading {plan.table} from PostgreSQL at {redacted(plan.conninfo)!r} "
        f"failed: {reason}"
    )


def read_range(plan: ReadPlan, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the rows with ``lo <= key <= hi`` (and the plan's transaction range)."""
    query, params = plan.copy_statement(lo, hi)
    yield from copy_rows(plan, query, params)


def split_range(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous inclusive ranges covering lo..hi (fewer when the range is short)."""
    parts = max(1, min(parts, hi - lo + 1))
    step = (hi - lo + 1) / parts
    bounds = [lo + round(i * step) for i in range(parts)] + [hi + 1]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(parts)]


def _parse(plan: ReadPlan, block: bytearray) -> Iterator[pa.RecordBatch]:
    schema = plan.arrow_schema()
    table = pacsv.read_csv(
        pa.py_buffer(block),
        read_options=pacsv.ReadOptions(
            column_names=[c.name for c in plan.columns],
            block_size=len(block) + 1,
            use_threads=False,
        ),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        # COPY CSV writes NULL unquoted and the empty string as "": keep them apart.
        convert_options=pacsv.ConvertOptions(
            column_types={c.name: _KINDS[c.kind][1] for c in plan.columns},
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
            true_values=["t"],
            false_values=["f"],
        ),
    )
    for batch in table.to_batches():
        arrays = [
            column.cast(field.type) if column.type != field.type else column
            for column, field in zip(batch.columns, schema, strict=True)
        ]
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)


# -- batch ------------------------------------------------------------------------------------
