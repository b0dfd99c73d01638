"""A PySpark 4 Python Data Source that reads ranges of a pgmsg table, one connection per task.

This module runs inside Spark's Python workers, so it imports neither Django nor the rest of
pgmsg: everything it needs (connection string, table, columns, key ranges, transaction-id
bounds) arrives as data source options. Each partition COPYs its key range out of PostgreSQL
as CSV and parses it with pyarrow block by block, so rows reach Spark as Arrow record batches.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pyarrow as pa
from psycopg import sql
from pyarrow import csv as pacsv
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
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

#: Name to pass to ``spark.read.format()``.
FORMAT = "pgmsg"

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
    ranges: tuple[tuple[int, int], ...]
    #: Only rows with lower <= transaction_column < upper (gap-free incremental reads).
    transaction_column: str | None = None
    transaction_range: tuple[int, int] | None = None
    block_size: int = DEFAULT_BLOCK_SIZE

    def to_options(self) -> dict[str, str]:
        plan = {
            "table": self.table,
            "key": self.key,
            "columns": [[c.name, c.kind, c.source, c.field] for c in self.columns],
            "ranges": [list(r) for r in self.ranges],
            "transaction_column": self.transaction_column,
            "transaction_range": list(self.transaction_range) if self.transaction_range else None,
            "block_size": self.block_size,
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
        )

    def spark_schema(self) -> StructType:
        return StructType([StructField(c.name, c.spark_type(), True) for c in self.columns])

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.arrow_type()) for c in self.columns])

    def copy_statement(self, lo: int, hi: int) -> tuple[sql.Composed, dict]:
        """COPY of one key range as CSV; bounds are parameters, names are identifiers."""
        where = [sql.SQL("{k} >= %(lo)s AND {k} <= %(hi)s").format(k=sql.Identifier(self.key))]
        params: dict = {"lo": lo, "hi": hi}
        if self.transaction_column and self.transaction_range:
            where.append(
                sql.SQL("{t} >= %(tx_lo)s::text::xid8 AND {t} < %(tx_hi)s::text::xid8").format(
                    t=sql.Identifier(self.transaction_column)
                )
            )
            tx_lo, tx_hi = self.transaction_range
            params.update(tx_lo=str(tx_lo), tx_hi=str(tx_hi))
        query = sql.SQL(
            "COPY (SELECT {cols} FROM {table} WHERE {where} ORDER BY {key}) "
            "TO STDOUT WITH (FORMAT csv)"
        ).format(
            cols=sql.SQL(", ").join(c.select() for c in self.columns),
            table=sql.Identifier(self.table),
            where=sql.SQL(" AND ").join(where),
            key=sql.Identifier(self.key),
        )
        return query, params


def read_range(plan: ReadPlan, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the rows with ``lo <= key <= hi``, read over a connection of its own.

    COPY sends one row per message, so rows are gathered into blocks of about
    ``plan.block_size`` bytes that end on a row boundary (a row larger than that is a block of
    its own), and each block is parsed while PostgreSQL keeps sending.
    """
    query, params = plan.copy_statement(lo, hi)
    with psycopg.connect(plan.conninfo) as conn:
        conn.read_only = True
        with conn.cursor() as cursor, cursor.copy(query, params) as copy:
            block = bytearray()
            for row in copy:
                block += row
                if len(block) >= plan.block_size:
                    yield from _parse(plan, block)
                    block = bytearray()
            if block:
                yield from _parse(plan, block)


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


class RangePartition(InputPartition):
    def __init__(self, lo: int, hi: int) -> None:
        super().__init__((lo, hi))
        self.lo = lo
        self.hi = hi


class PgmsgReader(DataSourceReader):
    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan

    def partitions(self) -> list[RangePartition]:
        return [RangePartition(lo, hi) for lo, hi in self.plan.ranges]

    def read(self, partition: RangePartition) -> Iterator[pa.RecordBatch]:
        yield from read_range(self.plan, partition.lo, partition.hi)


class PgmsgDataSource(DataSource):
    """``spark.read.format("pgmsg").options(**ReadPlan(...).to_options()).load()``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return ReadPlan.from_options(self.options).spark_schema()

    def reader(self, schema: StructType) -> PgmsgReader:
        return PgmsgReader(ReadPlan.from_options(self.options))
