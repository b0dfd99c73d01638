"""The export on a real Spark standalone cluster (a Master and two Workers of 1 core each, from
the pyspark package): the same rows as local[*], read partitions on both workers, executors
without Django or pgmsg, and a clear failure when executors cannot reach PostgreSQL."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

import pgmsg
from pgmsg import export
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import ROOT
from pgmsg_tests.export.helpers import assert_same_rows, read_dataset, settle, watermark_row

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.spark]


def export_on(cluster, *args: str) -> subprocess.CompletedProcess:
    """`manage.py pgmsg_export` on the cluster, as a process of its own (the driver)."""
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="pgmsg_tests.settings",
        DATABASE_URL=database_url(connection.settings_dict),
        PYTHONUNBUFFERED="1",
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "django",
            "pgmsg_export",
            "--master",
            cluster.url,
            *cluster.conf(),
            *args,
        ],  # fmt: skip
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def make_messages() -> None:
    from pgmsg.events import store
    from pgmsg.inbox import declarations as inbox

    class Moved(store.Event, type="cluster.moved"):
        n: int
        note: str

    for s in range(6):
        store.append(f"crate-{s}", [Moved(n=s * 10 + i, note=f'q"uote,\n{i} ✓') for i in range(7)])
    inbox.receive_many(
        "test.inbox",
        [
            {"message_id": f"c{i}", "type": "work", "payload": {"i": i, "s": "x" * i}}
            for i in range(25)
        ],
    )
    settle("pgmsg_event")
    settle("pgmsg_inbox_message")


def test_the_cluster_exports_the_same_rows_as_local_on_both_workers(spark_cluster, spark, tmp_path):
    make_messages()
    proc = export_on(
        spark_cluster,
        "--output", str(tmp_path / "cluster"),
        "--tables", "events", "inbox_messages",
        "--partitions", "4",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    [application] = re.findall(r"application (app-\S+)\)", proc.stdout)
    assert "exported 67 row(s) of 2 table(s)" in proc.stdout

    local = export.export_tables(
        str(tmp_path / "local"),
        spark=spark,
        tables=["events", "inbox_messages"],
        partitions=4,
        full=True,
    )
    assert local.rows == 67
    for name, table, key in (
        ("events", "pgmsg_event", "position"),
        ("inbox_messages", "pgmsg_inbox_message", "id"),
    ):
        on_cluster = sorted(read_dataset(tmp_path / "cluster" / name), key=lambda r: r[key])
        on_local = sorted(read_dataset(tmp_path / "local" / name), key=lambda r: r[key])
        assert on_cluster == on_local  # every value of every row
        assert_same_rows(on_cluster, table, key)
        assert watermark_row(name).transaction_xmin is not None

    # Each worker's executor ran read tasks, in a Python without pgmsg (the driver shipped it).
    logs = spark_cluster.executor_logs(application)
    assert all(re.search(r"Finished task \d+\.\d+ in stage", log) for log in logs), logs
    used = spark_cluster.python_calls.read_text().splitlines()
    assert {str(work_dir) for work_dir in spark_cluster.work_dirs} <= {
        str(Path(cwd).parent.parent) for cwd in used if application in cwd
    }
    probe = subprocess.run(
        [str(spark_cluster.python), "-c", "import pgmsg"],
        cwd=spark_cluster.work_dirs[0],
        env=spark_cluster.env(),
        capture_output=True,
        text=True,
    )
    assert "No module named 'pgmsg'" in probe.stderr


def test_executors_that_cannot_reach_postgresql_fail_the_run_naming_the_url(
    spark_cluster, tmp_path
):
    make_messages()
    before = watermark_row("events")
    unreachable = "postgresql://postgres:s3cret-pw@127.0.0.1:1/pgmsg_nowhere"
    proc = export_on(
        spark_cluster,
        "--output", str(tmp_path / "out"),
        "--tables", "events",
        "--database-url", unreachable,
        "--conf", "spark.task.maxFailures=2",
        "--conf", "spark.cores.max=1",  # one executor is enough to fail
    )  # fmt: skip
    assert proc.returncode == 1
    # One line names the cause. Spark's shutdown may still log a WARN line after it.
    errors = [line for line in proc.stderr.splitlines() if line.startswith("CommandError")]
    assert len(errors) == 1, proc.stderr[-3000:]
    last = errors[0]
    assert re.fullmatch(
        r"CommandError: export: writing events to \S+/out/events failed; its watermark is "
        r"unchanged: pgmsg source: cannot connect to PostgreSQL at "
        r"'postgresql://postgres@127\.0\.0\.1:1/pgmsg_nowhere' from this executor: "
        r".*Connection refused.*",
        last,
    ), last
    assert "s3cret-pw" not in proc.stdout + proc.stderr
    after = watermark_row("events")
    assert (after and after.transaction_xmin) == (before and before.transaction_xmin)
    assert not [p for p in (tmp_path / "out").rglob("*.parquet")]
    pgmsg  # noqa: B018  (the public package stays importable alongside the export)
