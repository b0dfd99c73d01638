"""Shared by the export tests: reading datasets back with pyarrow alone, comparing them with
PostgreSQL, and waiting for the export's gap-free horizon."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from django.db import connection

from pgmsg.core import horizon
from pgmsg.export import output
from pgmsg.models import ExportWatermark
from pgmsg_tests.conftest import wait_for


def read_dataset(path) -> list[dict]:
    """Every row of a (hive-partitioned) Parquet dataset, by pyarrow alone."""
    if not os.path.isdir(path):
        return []
    dataset = pads.dataset(str(path), format="parquet", partitioning="hive")
    return dataset.to_table().to_pylist()


def db_rows(table: str, key: str) -> list[dict]:
    """The table as PostgreSQL has it, with JSON as parsed values and xid8 as an int."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
            [table],
        )
        types = dict(cursor.fetchall())
        select = ", ".join(
            f'"{name}"::text::bigint'
            if db_type == "xid8"
            else f'"{name}"::text'
            if db_type in ("jsonb", "uuid")
            else f'"{name}"'
            for name, db_type in types.items()
        )
        cursor.execute(f"SELECT {select} FROM {table} ORDER BY {key}")
        rows = [dict(zip(types, row, strict=True)) for row in cursor.fetchall()]
    for row in rows:
        for name, db_type in types.items():
            if db_type == "jsonb":
                row[name] = json.loads(row[name])
    return rows, types


def assert_same_rows(exported: list[dict], table: str, key: str, *, flatten=(), payload=None):
    """Every column of every row equals PostgreSQL's value, JSON compared parsed."""
    expected, types = db_rows(table, key)
    exported = sorted(exported, key=lambda r: r[key])
    assert [r[key] for r in exported] == [r[key] for r in expected]
    for got, want in zip(exported, expected, strict=True):
        for name, db_type in types.items():
            value = got[name]
            if db_type == "jsonb":
                assert isinstance(value, str), (name, value)
                value = json.loads(value)
            assert value == want[name], (name, got[key], value, want[name])
        for field in flatten:
            raw = want[payload].get(field) if isinstance(want[payload], dict) else None
            text = raw if raw is None or isinstance(raw, str) else json.dumps(raw)
            if isinstance(raw, bool):
                text = "true" if raw else "false"
            assert got[f"{payload}_{field}"] == text, (field, got, want)


def settle(table: str) -> None:
    """Wait until every transaction up to the table's newest row has ended: until pgmsg's read
    horizon, which bounds an export's reads, passes it (transactions of other databases do not
    hold it back; open writing transactions of this one do)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT max(transaction_id)::text::bigint FROM {table}")
        newest = cursor.fetchone()[0]

    def passed() -> bool:
        with connection.cursor() as cursor:
            return horizon.horizon(cursor) > newest

    wait_for(passed, timeout=120, message=f"the read horizon to pass {table}'s rows")


def watermark_row(name: str):
    return ExportWatermark.objects.filter(name=name).first()


def read_committed(path) -> list[dict]:
    """The rows of a streaming dataset's committed files (its sink log), by pyarrow alone."""
    files = output.sink_files(str(path)) or []
    if not files:
        return []
    dataset = pads.dataset(
        files,
        format="parquet",
        partitioning=pads.partitioning(flavor="hive"),
        partition_base_dir=str(path),
    )
    return dataset.to_table().to_pylist()


def read_files(files) -> pa.Table:
    return pa.concat_tables([pq.read_table(f) for f in files])


def latest_versions(rows: list[dict], key: str) -> list[dict]:
    """The newest version (highest transaction_id) of each row of a log of row versions."""
    newest: dict = {}
    for row in rows:
        if row[key] not in newest or row["transaction_id"] > newest[row[key]]["transaction_id"]:
            newest[row[key]] = row
    return sorted(newest.values(), key=lambda r: r[key])
