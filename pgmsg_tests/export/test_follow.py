"""The continuous export (`pgmsg_export --follow`): Spark Structured Streaming over gap-free
checkpoints. Killed with SIGKILL in the middle of a micro-batch while two processes write (one
committing late) and restarted, it leaves every event in the Parquet exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from pgmsg.core import errors
from pgmsg.export import follow
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import ROOT, wait_for
from pgmsg_tests.export.helpers import assert_same_rows, read_committed, read_dataset

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.spark]


def env() -> dict:
    return dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="pgmsg_tests.settings",
        DATABASE_URL=database_url(connection.settings_dict),
        PYTHONUNBUFFERED="1",
    )


def start(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "a") as out:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def start_follow(tmp_path: Path, log: Path) -> subprocess.Popen:
    return start(
        [
            "-m", "django", "pgmsg_export", "--follow",
            "--output", str(tmp_path / "lake"),
            "--checkpoint", str(tmp_path / "checkpoint"),
            "--tables", "events",
            "--master", "local[1]",
            "--trigger-interval", "0.5",
            "--max-rows-per-batch", "100",
            "--conf", "spark.ui.enabled=false",
            "--conf", "spark.driver.memory=512m",
        ],
        log,
    )  # fmt: skip


def batches(checkpoint: Path, kind: str) -> set[int]:
    folder = checkpoint / "events" / kind
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.is_dir() else set()


def db_positions() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT position FROM pgmsg_event ORDER BY position")
        return [p for (p,) in cursor.fetchall()]


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.spark
def test_a_killed_follow_export_restarts_and_exports_every_event_exactly_once(tmp_path):
    from pgmsg_tests.export.conftest import needs_java

    needs_java()
    log = tmp_path / "follow.log"
    checkpoint = tmp_path / "checkpoint"
    release = tmp_path / "release-late-writer"
    procs = []
    try:
        exporter = start_follow(tmp_path, log)
        procs.append(exporter)
        wait_for(lambda: "following events" in log.read_text(), timeout=180, message="follow")
        late = start(
            ["-m", "pgmsg_tests.scripts.export_writer", "late", "120", str(release)],
            tmp_path / "late.log",
        )
        wait_for(lambda: "holding" in (tmp_path / "late.log").read_text(), message="late writer")
        steady = start(
            ["-m", "pgmsg_tests.scripts.export_writer", "steady", "400"], tmp_path / "steady.log"
        )
        procs += [late, steady]
        # The steady writer commits 400 events with higher transaction ids than the open late
        # transaction: none of them may be exported before it ends, or it would be skipped.
        assert steady.wait(120) == 0
        assert read_committed(tmp_path / "lake" / "events") == []
        release.touch()
        wait_for(
            lambda: len(batches(checkpoint, "commits")) >= 2,
            timeout=120,
            message="micro-batches after the late commit",
        )

        # SIGKILL while a micro-batch runs: its offsets are logged, its commit is not.
        def mid_batch() -> bool:
            return bool(batches(checkpoint, "offsets") - batches(checkpoint, "commits"))

        wait_for(mid_batch, interval=0.005, timeout=120, message="a micro-batch in progress")
        kill(exporter)
        unfinished = batches(checkpoint, "offsets") - batches(checkpoint, "commits")
        assert unfinished, "the kill did not land inside a micro-batch"
        assert late.wait(60) == 0
        assert len(db_positions()) == 520

        restarted = start_follow(tmp_path, log)
        procs.append(restarted)
        wait_for(
            lambda: len(read_committed(tmp_path / "lake" / "events")) >= 520,
            timeout=240,
            message="every event exported after the restart",
        )
        restarted.send_signal(signal.SIGTERM)
        assert restarted.wait(60) == 0, log.read_text()[-3000:]
    finally:
        for proc in procs:
            kill(proc)

    committed = read_committed(tmp_path / "lake" / "events")
    positions = sorted(r["position"] for r in committed)
    assert positions == db_positions()  # every event, none twice
    assert_same_rows(committed, "pgmsg_event", "position")
    # The killed batch's own files were removed at the restart: plain readers agree.
    assert sorted(r["position"] for r in read_dataset(tmp_path / "lake" / "events")) == positions
    text = log.read_text()
    assert "events batch" in text and "behind the database:" in text
    assert "stopped following" in text


def test_snapshot_tables_cannot_be_followed(tmp_path):
    with pytest.raises(errors.ExportError, match=r"\['notifications'\] cannot be followed"):
        follow.follow(
            str(tmp_path / "lake"), checkpoint=str(tmp_path / "c"), tables=["notifications"]
        )
    assert not (tmp_path / "lake").exists()


def test_follow_refuses_a_dataset_written_by_batch_runs(tmp_path):
    batch_file = tmp_path / "lake" / "events" / "day=2026-01-01" / "part-0.parquet"
    batch_file.parent.mkdir(parents=True)
    batch_file.write_bytes(b"PAR1")
    with pytest.raises(errors.ExportError, match="give --follow an output of its own"):
        follow.follow(str(tmp_path / "lake"), checkpoint=str(tmp_path / "c"), tables=["events"])


@pytest.mark.spark
def test_an_unreachable_database_fails_the_follow_export_at_once_naming_the_url(spark, tmp_path):
    """The warm-up read before the queries start reaches PostgreSQL from the executors."""
    with pytest.raises(errors.ExportError) as failed:
        follow.follow(
            str(tmp_path / "lake"),
            checkpoint=str(tmp_path / "c"),
            tables=["events"],
            spark=spark,
            database_url="postgresql://postgres:s3cret@127.0.0.1:1/nowhere",
        )
    message = str(failed.value)
    assert "cannot connect to PostgreSQL at 'postgresql://postgres@127.0.0.1:1/nowhere'" in message
    assert "s3cret" not in message
    assert not (tmp_path / "c" / "events").exists()  # no query was started
