"""The read tasks' own Parquet writer (pgmsg/export/files.py): the same dataset as Spark's writer
(layout, escaped partition names, values, types), readable by Spark, and nothing left behind by
a run whose tasks fail."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.dataset as pads
import pytest
from django.db import connection

import pgmsg
from pgmsg import export
from pgmsg.core import errors
from pgmsg.export import tables
from pgmsg_tests.export.helpers import assert_same_rows, read_dataset, settle, watermark_row
from pgmsg_tests.testapp.channels import Unheard

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.spark]

INBOX = "test.task-writer"
# Characters Spark escapes in partition directory names, and plain ones.
TYPES = ["a/b", "x=y", "50%", "why?", 'q"t', "sp ace", "ünï", "plain", "#[^]{}*:\\'"]


def layout(path: Path) -> list[str]:
    """The dataset's directories and how many data files each holds (names differ by run)."""
    found = {}
    for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        data = [n for n in names if n.endswith(".parquet")]
        found[os.path.relpath(root, path)] = bool(data)
    return sorted(d for d, has_data in found.items() if has_data)


def spark_rows(spark, path: Path) -> list[tuple]:
    frame = spark.read.parquet(str(path))
    return sorted(tuple(row) for row in frame.orderBy("id").collect())


@pytest.mark.parametrize("partition_by", ["type", "category", "day", "none"])
def test_the_task_writer_writes_the_dataset_sparks_writer_writes(spark, tmp_path, partition_by):
    from pgmsg.inbox import declarations as inbox

    if INBOX not in inbox.registry.inboxes:
        pgmsg.Inbox(INBOX)
    inbox.receive_many(
        INBOX,
        [
            {"message_id": f"w{i}", "type": TYPES[i % len(TYPES)], "payload": {"i": i}}
            for i in range(40)
        ],
    )
    settle("pgmsg_inbox_message")
    written = {}
    for writer in export.WRITERS:
        summary = export.export_tables(
            str(tmp_path / writer),
            spark=spark,
            tables=["inbox_messages"],
            partitions=3,
            partition_by=partition_by,
            full=True,
            writer=writer,
        )
        assert summary.results[0].rows == 40
        written[writer] = tmp_path / writer / "inbox_messages"
    tasks, sparks = written["tasks"], written["spark"]
    assert layout(tasks) == layout(sparks)  # the same partition directories, escaped alike
    assert (tasks / "_SUCCESS").exists()
    assert not [p for p in tasks.iterdir() if p.name.startswith("_pgmsg")]  # staging removed
    by_tasks = pads.dataset(str(tasks), format="parquet", partitioning="hive")
    by_spark = pads.dataset(str(sparks), format="parquet", partitioning="hive")
    assert by_tasks.schema.remove_metadata() == by_spark.schema.remove_metadata()
    rows = sorted(read_dataset(tasks), key=lambda r: r["id"])
    assert rows == sorted(read_dataset(sparks), key=lambda r: r["id"])
    if partition_by == "none":
        assert_same_rows(rows, "pgmsg_inbox_message", "id")
    # Spark reads both the same way (types from the files, partition values unescaped).
    assert spark_rows(spark, tasks) == spark_rows(spark, sparks)
    assert watermark_row("inbox_messages").transaction_xmin is not None


def test_an_overwrite_replaces_a_dataset_written_by_sparks_writer(spark, tmp_path):
    pgmsg.notify_many(Unheard(key=f"o{i}") for i in range(5))
    path = tmp_path / "notifications"
    export.export_tables(str(tmp_path), spark=spark, tables=["notifications"], writer="spark")
    old = {p.name for p in path.rglob("*") if p.is_file()}
    summary = export.export_tables(str(tmp_path), spark=spark, tables=["notifications"])
    assert summary.plans[0].mode == "overwrite" and summary.results[0].rows == 5
    now = {p.name for p in path.rglob("*") if p.is_file()}
    assert not old & (now - {"_SUCCESS"})  # none of the old files is left
    assert len(read_dataset(path)) == 5


@pytest.fixture
def failing_table():
    """A table whose second read partition fails late (a timestamp COPY cannot convert) while
    its first, small one succeeds and writes its files first."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE export_late_failure (id bigint PRIMARY KEY, ts timestamptz, x xid8)"
        )
        cursor.execute(
            "INSERT INTO export_late_failure SELECT i, CASE WHEN i = 200000 THEN"
            " 'infinity'::timestamptz ELSE now() END, '5'::xid8"
            " FROM generate_series(1, 100) AS i UNION ALL SELECT i, CASE WHEN i = 200000 THEN"
            " 'infinity'::timestamptz ELSE now() END, '5'::xid8"
            " FROM generate_series(100001, 200000) AS i"
        )
    spec = export.register(
        export.TableSpec(
            name="late_failure", table="export_late_failure", key="id", timestamp="ts",
            transaction_column="x",
        )
    )  # fmt: skip
    yield spec
    tables.unregister(spec.name)
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE export_late_failure")


def test_a_run_whose_task_fails_leaves_no_file_of_the_tasks_that_succeeded(
    spark, tmp_path, failing_table
):
    out = tmp_path / "lake"
    with pytest.raises(errors.ExportError) as failed:
        export.export_tables(
            str(out), spark=spark, tables=["late_failure"], partitions=2, partition_by="none"
        )
    message = str(failed.value)
    assert "watermark is unchanged" in message and "infinity" in message, message
    # Neither the first partition's staged files nor any directory of this run is left.
    assert not out.exists(), sorted(str(p) for p in out.rglob("*"))
    assert watermark_row("late_failure") is None

    # The same failure into an existing dataset leaves its files as they were.
    (out / "late_failure").mkdir(parents=True)
    (out / "late_failure" / "kept.parquet").write_bytes(b"not touched")
    with pytest.raises(errors.ExportError):
        export.export_tables(
            str(out), spark=spark, tables=["late_failure"], partitions=2, partition_by="none",
            mode="overwrite",
        )  # fmt: skip
    assert sorted(p.name for p in (out / "late_failure").iterdir()) == ["kept.parquet"]
