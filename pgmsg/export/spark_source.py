"""The Spark data source ``"pgmsg"``: batch reads of key ranges, and a stream of checkpoints.

This module and pgmsg/export/reading.py (what a read does) run inside Spark's Python
workers, on executors that have neither Django nor pgmsg: the export registers both to be
pickled by value (see :func:`ship`), so their classes and functions travel with the job and
need only pyspark, psycopg and pyarrow there.

The stream (``spark.readStream.format("pgmsg")``) uses pgmsg's gap-free checkpoints as
offsets: ``{"transaction_id": t, "position": k}`` stands after every row whose
``(transaction id, key)`` is at most ``(t, k)``. A micro-batch ends at the greatest such pair
among rows of ended transactions (below pgmsg's read horizon, which transactions of other
databases do not hold back: pgmsg/core/horizon.sql), so a transaction that commits late
still sorts after the end of every batch planned while it was open, and a replayed batch reads
exactly the rows it read before.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import psycopg
import pyarrow as pa
from psycopg import sql
from pyspark import cloudpickle
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from pgmsg.core import sql as named_sql
from pgmsg.export import reading
from pgmsg.export.reading import (
    ReadPlan,
    SourceError,
    connect,
    copy_rows,
    read_range,
    redacted,
    split_range,
)

#: Name to pass to ``spark.read.format()`` and ``spark.readStream.format()``.
FORMAT = "pgmsg"

#: The core's read horizon statement, carried as a value like the read statements.
HORIZON = named_sql.load("pgmsg.core", "horizon.sql")["horizon"]


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


# -- stream -----------------------------------------------------------------------------------


def offset(transaction_id: int, position: int) -> dict:
    return {"transaction_id": int(transaction_id), "position": int(position)}


class StreamPartition(InputPartition):
    """Rows after ``start`` up to ``end`` (checkpoints) whose key is in ``lo..hi``."""

    def __init__(self, start: dict, end: dict, lo: int, hi: int) -> None:
        super().__init__((start, end, lo, hi))
        self.start = start
        self.end = end
        self.lo = lo
        self.hi = hi


class PgmsgStreamReader(DataSourceStreamReader):
    """Micro-batches between gap-free checkpoints; Spark's offset log makes them replayable.

    Spark keeps this reader in one Python process on the driver for the query's life: its
    planning queries share one autocommit connection (a new connection per trigger costs a
    backend start; an open transaction would hold back the very horizon it reads), and the
    span of the batch :meth:`latestOffset` planned is kept for :meth:`partitions`.
    """

    def __init__(self, plan: ReadPlan) -> None:
        if not plan.transaction_column:
            raise SourceError(
                f"pgmsg source: {plan.table} has no transaction id column; only incremental "
                "tables can be streamed"
            )
        self.plan = plan
        self._connection: psycopg.Connection | None = None
        #: (start, end, rows, lowest key, highest key) of the batch latestOffset planned last.
        self._planned: tuple[dict, dict, int, int, int] | None = None

    def __getstate__(self) -> dict:
        return self.__dict__ | {"_connection": None}

    def initialOffset(self) -> dict:
        return offset(*self.plan.start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.plan.max_rows_per_batch:
            return ReadMaxRows(self.plan.max_rows_per_batch)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit | None = None) -> dict:
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        params = _bounds(start, "start") | {"limit": rows}
        # The horizon in its own statement first: rows below it are read in a later one.
        params["horizon"] = str(self._fetch(HORIZON, {})[0])
        tx, key, count, lo, hi = self._fetch(self.plan.compose("head"), params)
        if not count:
            return start
        end = offset(tx, key)
        self._planned = (start, end, count, lo, hi)
        return end

    def partitions(self, start: dict, end: dict) -> list[StreamPartition]:
        if start == end:
            return []
        if self._planned and self._planned[:2] == (start, end):
            count, lo, hi = self._planned[2:]
        else:  # a batch logged before a restart, replayed: plan it again
            params = _bounds(start, "start") | _bounds(end, "end")
            count, lo, hi = self._fetch(self.plan.compose("span"), params)
        if not count:
            return []
        parts = max(1, -(-count // self.plan.rows_per_partition))
        return [StreamPartition(start, end, a, b) for a, b in split_range(lo, hi, parts)]

    def stop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _fetch(self, query: sql.Composable | str, params: dict) -> tuple:
        """One row of a planning query; a connection lost since the last trigger is opened
        again once (PostgreSQL restarted, an idle timeout)."""
        for attempt in (1, 2):
            if self._connection is None or self._connection.closed:
                self._connection = connect(self.plan.conninfo)
                self._connection.autocommit = True
            try:
                row = self._connection.execute(query, params or None).fetchone()
                assert row is not None
                return tuple(row)
            except psycopg.OperationalError as exc:
                self._connection.close()
                self._connection = None
                if attempt == 2:
                    reason = " ".join(str(exc).split())
                    raise SourceError(
                        f"pgmsg source: planning a micro-batch of {self.plan.table} at "
                        f"{redacted(self.plan.conninfo)!r} failed: {reason}"
                    ) from None
        raise AssertionError("unreachable")

    def read(self, partition: StreamPartition) -> Iterator[pa.RecordBatch]:
        params = (
            _bounds(partition.start, "start")
            | _bounds(partition.end, "end")
            | {"lo": partition.lo, "hi": partition.hi}
        )
        yield from copy_rows(self.plan, self.plan.compose("copy_after"), params)


def _bounds(point: dict, prefix: str) -> dict:
    return {
        f"{prefix}_tx": str(int(point["transaction_id"])),
        f"{prefix}_key": int(point["position"]),
    }


class PgmsgDataSource(DataSource):
    """``spark.read.format("pgmsg").options(**ReadPlan(...).to_options()).load()``; likewise
    ``spark.readStream`` for tables with a transaction id."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return ReadPlan.from_options(self.options).spark_schema()

    def reader(self, schema: StructType) -> PgmsgReader:
        return PgmsgReader(ReadPlan.from_options(self.options))

    def streamReader(self, schema: StructType) -> PgmsgStreamReader:
        return PgmsgStreamReader(ReadPlan.from_options(self.options))


def ship(spark) -> None:
    """Register the data source with ``spark``, its code pickled by value for the executors."""
    cloudpickle.register_pickle_by_value(reading)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(PgmsgDataSource)
