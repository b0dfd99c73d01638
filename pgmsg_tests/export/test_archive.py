"""Archive to the lake: old event partitions to Parquet, counted, then dropped; a run that
stops midway drops nothing; reading an archived part of a stream names the archive."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading

import psycopg
import pytest
from django.db import connection, transaction

import pgmsg
from pgmsg.core import errors, partitions
from pgmsg.core.worker import Worker
from pgmsg.events import store, subscription_operations, subscriptions
from pgmsg.export import archive
from pgmsg.models import Archive, EventKey, StoredEvent, SubscriptionPartition
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import ROOT, wait_for
from pgmsg_tests.export.helpers import read_dataset, settle
from pgmsg_tests.testapp.events_handlers import audit
from pgmsg_tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.spark]

TABLE = "pgmsg_event"


class Noted(store.Event, type="archive.noted"):
    n: int


def _month(offset: int) -> tuple[str, dt.datetime, dt.datetime]:
    """The event partition of the month ``offset`` months from this one, made if missing."""
    today = dt.datetime.now(dt.UTC)
    index = today.year * 12 + today.month - 1 + offset
    start = dt.datetime(index // 12, index % 12 + 1, 1, tzinfo=dt.UTC)
    index += 1
    end = dt.datetime(index // 12, index % 12 + 1, 1, tzinfo=dt.UTC)
    name = f"{TABLE}_p{start:%Y%m}"
    with transaction.atomic(), connection.cursor() as cursor:
        if name not in {p.name for p in partitions.partitions(cursor, TABLE)}:
            partitions.create(cursor, TABLE, name, start, end)
    return name, start, end


def _stores(stream: str, versions: range, month_start: dt.datetime) -> None:
    StoredEvent.objects.filter(stream_name=stream, version__in=list(versions)).update(
        recorded_at=month_start + dt.timedelta(days=1)
    )


def _events_spread_over_months() -> dict:
    """order-1 v1-3 three months back, order-2 v1 two months back, the rest this month."""
    store.append("order-1", [Noted(n=i) for i in range(5)])
    store.append("order-2", [Noted(n=i) for i in range(3)])
    oldest, older = _month(-3), _month(-2)
    _stores("order-1", range(1, 4), oldest[1])
    _stores("order-2", range(1, 2), older[1])
    return {"oldest": oldest, "older": older, "before": older[2]}


def _all_rows() -> set[tuple[int, str, int, str]]:
    return {
        (e.position, e.stream_name, e.version, str(e.message_id)) for e in StoredEvent.objects.all()
    }


def _parquet_rows(path) -> set[tuple[int, str, int, str]]:
    return {
        (r["position"], r["stream_name"], r["version"], str(r["message_id"]))
        for r in read_dataset(path)
    }


def _partition_names() -> set[str]:
    with connection.cursor() as cursor:
        return {p.name for p in partitions.partitions(cursor, TABLE)}


def test_a_finished_archive_leaves_postgresql_and_parquet_with_exactly_the_rows(spark, tmp_path):
    spread = _events_spread_over_months()
    everything = _all_rows()
    done = archive.archive(spread["before"], str(tmp_path), spark=spark)
    assert [(a.partition, a.rows) for a in done] == [
        (spread["oldest"][0], 3),
        (spread["older"][0], 1),
    ]
    assert not {spread["oldest"][0], spread["older"][0]} & _partition_names()
    in_parquet = set()
    for name in (spread["oldest"][0], spread["older"][0]):
        rows = _parquet_rows(tmp_path / name)
        assert not rows & in_parquet
        in_parquet |= rows
    left = _all_rows()
    assert not in_parquet & left
    assert in_parquet | left == everything
    assert set(Archive.objects.values_list("status", flat=True)) == {"archived"}
    # The keys of the dropped events went with them.
    assert set(EventKey.objects.values_list("message_id", flat=True)) == set(
        StoredEvent.objects.values_list("message_id", flat=True)
    )
    # Nothing more is due: a second run does nothing.
    assert archive.archive(spread["before"], str(tmp_path), spark=spark) == []


def test_reading_an_archived_part_of_a_stream_names_where_it_went(spark, tmp_path):
    spread = _events_spread_over_months()
    archive.archive(spread["before"], str(tmp_path), spark=spark)
    with pytest.raises(errors.ArchivedEvents, match=r"versions 1\.\.3 .*" + spread["oldest"][0]):
        pgmsg.read_stream("order-1")
    with pytest.raises(errors.ArchivedEvents, match=spread["older"][0]):
        pgmsg.read_stream("order-2", backwards=True)
    # The part still in PostgreSQL reads as before; versions go on from where they were.
    assert [e.version for e in pgmsg.read_stream("order-1", start=4)] == [4, 5]
    assert [e.version for e in pgmsg.read_stream("order-2", backwards=True, limit=2)] == [3, 2]
    assert store.append("order-1", Noted(n=9), expected_version=5) == 6
    # Streams that were never archived, or do not exist, read as before.
    assert pgmsg.read_stream("order-9") == []


def test_an_export_that_fails_midway_drops_nothing_and_a_rerun_finishes(spark, tmp_path):
    spread = _events_spread_over_months()
    everything = _all_rows()
    older = spread["older"][0]

    def break_the_second_export(line: str) -> None:
        # Spark is about to read the second partition: it will find no such table.
        if line.startswith(f"exporting {older}"):
            with connection.cursor() as cursor:
                cursor.execute(f"ALTER TABLE {older} RENAME TO {older}_away")

    with pytest.raises(errors.ExportError):
        archive.archive(spread["before"], str(tmp_path), spark=spark, echo=break_the_second_export)
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {older}_away RENAME TO {older}")
    # The first partition was archived; the second is intact, its record says it stopped.
    assert spread["oldest"][0] not in _partition_names()
    assert older in _partition_names()
    assert Archive.objects.get(partition=older).status == "exporting"
    assert _all_rows() == {
        r for r in everything if r[1:3] not in {("order-1", v) for v in (1, 2, 3)}
    }

    archive.archive(spread["before"], str(tmp_path), spark=spark)
    in_parquet = _parquet_rows(tmp_path / spread["oldest"][0]) | _parquet_rows(tmp_path / older)
    assert in_parquet | _all_rows() == everything
    assert not in_parquet & _all_rows()


def test_a_row_that_arrives_after_the_export_read_stops_the_drop(spark, tmp_path):
    spread = _events_spread_over_months()
    oldest, start = spread["oldest"][0], spread["oldest"][1]

    def late_row(line: str) -> None:
        if line.startswith(f"exporting {oldest}"):  # planned: a late append lands after it
            store.append("order-3", Noted(n=1))
            _stores("order-3", range(1, 2), start)

    with pytest.raises(errors.ArchiveError, match="nothing was dropped"):
        archive.archive(spread["before"], str(tmp_path), spark=spark, echo=late_row)
    assert oldest in _partition_names()
    assert StoredEvent.objects.filter(stream_name="order-3").exists()


def test_a_run_killed_midway_drops_nothing_and_a_rerun_finishes(spark, tmp_path):
    spread = _events_spread_over_months()
    everything = _all_rows()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(connection.settings_dict),
        "DJANGO_SETTINGS_MODULE": "pgmsg_tests.settings",
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    command = [
        sys.executable, "-m", "django", "pgmsg_archive", "--master", "local[1]",
        "--before", spread["before"].isoformat(), "--output", str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(
            lambda: Archive.objects.filter(status="exporting").exists() or proc.poll() is not None,
            timeout=180,
            interval=0.02,
            message="pgmsg_archive starts exporting",
        )
        assert proc.poll() is None, "pgmsg_archive ended before it started exporting"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert spread["oldest"][0] in _partition_names()
    assert _all_rows() == everything

    # The killed run's backend lets go of the archive lock once the server sees it gone.
    def lock_free() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT NOT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' "
                "AND classid = 1885826372 AND objid = 0 AND objsubid = 2)"
            )
            return cursor.fetchone()[0]

    wait_for(lock_free, message="the killed run's archive lock is released")
    archive.archive(spread["before"], str(tmp_path), spark=spark)
    in_parquet = _parquet_rows(tmp_path / spread["oldest"][0]) | _parquet_rows(
        tmp_path / spread["older"][0]
    )
    assert in_parquet | _all_rows() == everything
    assert not in_parquet & _all_rows()


def test_the_incremental_export_reads_events_from_every_partition(spark, tmp_path):
    from pgmsg import export

    spread = _events_spread_over_months()
    settle(TABLE)
    export.export_tables(str(tmp_path), spark=spark, tables=["events"])
    assert len({n for n in _partition_names()} & {spread["oldest"][0], spread["older"][0]}) == 2
    assert _parquet_rows(tmp_path / "events") == _all_rows()


def _drain_audit() -> None:
    Worker(subscriptions=[audit.name], until_idle=True, install_signal_handlers=False).run()


def test_a_subscription_that_has_not_passed_a_partition_stops_the_archive(spark, tmp_path):
    spread = _events_spread_over_months()
    with transaction.atomic(), connection.cursor() as cursor:
        subscriptions.ensure_partitions(audit, cursor)  # at the beginning: behind every event
    rows = _all_rows()
    with pytest.raises(errors.ArchiveError, match=r"subscription\(s\) 'test-audit' \(1 partition"):
        archive.archive(spread["before"], str(tmp_path), spark=spark)
    assert _all_rows() == rows
    assert {spread["oldest"][0], spread["older"][0]} <= _partition_names()
    assert not Archive.objects.exists()


def test_a_subscription_behind_a_forced_archive_stops_there_instead_of_skipping(spark, tmp_path):
    # As a store that ran for months: old events in earlier transactions than newer ones.
    oldest, older = _month(-3), _month(-2)
    store.append("old-1", [Noted(n=i) for i in range(3)])
    _stores("old-1", range(1, 4), oldest[1])
    store.append("old-2", [Noted(n=i) for i in range(2)])
    _stores("old-2", range(1, 3), older[1])
    store.append("new-1", [Noted(n=i) for i in range(4)])
    spread = {"oldest": oldest, "older": older, "before": older[2]}
    with transaction.atomic(), connection.cursor() as cursor:
        subscriptions.ensure_partitions(audit, cursor)
    kept = sorted(
        StoredEvent.objects.filter(stream_name="new-1").values_list("position", flat=True)
    )
    done = archive.archive(spread["before"], str(tmp_path), spark=spark, force=True)
    assert [d.partition for d in done] == [oldest[0], older[0]]

    _drain_audit()
    row = SubscriptionPartition.objects.get(subscription=audit.name)
    assert row.status == "stopped"
    assert spread["oldest"][0] in row.last_error and str(tmp_path) in row.last_error
    assert "reset test-audit --to archive" in row.last_error
    assert not Effect.objects.filter(channel="sub.audit").exists()  # nothing passed over

    # The operator moves it past the archive: it handles the events still in PostgreSQL.
    assert subscription_operations.reset(audit.name, to="archive") == 1
    wait_for(
        lambda: (
            _drain_audit(),
            Effect.objects.filter(channel="sub.audit").count() >= len(kept),
        )[1],
        message="the subscription handles the events after the archive",
        timeout=180,
    )
    handled = sorted(e.data["position"] for e in Effect.objects.filter(channel="sub.audit"))
    assert handled == kept


def test_an_archive_run_waits_for_no_other_it_refuses_while_one_holds_the_lock():
    spread = _events_spread_over_months()
    with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(1885826372, 0)")  # another run's lock
        with pytest.raises(errors.ArchiveRunning, match="another pgmsg_archive run"):
            archive.archive(spread["before"], "/nonexistent")
    assert {spread["oldest"][0], spread["older"][0]} <= _partition_names()


def test_workers_archive_periodically_in_a_child_process(settings, monkeypatch, tmp_path):
    """PGMSG ARCHIVE_INTERVAL: a worker serving subscriptions starts pgmsg_archive in a child
    process once its subscriptions have passed the due partitions."""
    spread = _events_spread_over_months()
    everything = _all_rows()
    # The child is started with the worker's environment: point it at the test database.
    monkeypatch.setenv("DATABASE_URL", database_url(connection.settings_dict))
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "pgmsg_tests.settings")
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    after = (dt.datetime.now(dt.UTC) - spread["before"]).total_seconds()
    settings.PGMSG = {
        **settings.PGMSG,
        "ARCHIVE_INTERVAL": 0.5,
        "ARCHIVE_PATH": str(tmp_path),
        "ARCHIVE_AFTER": after,
        "EXPORT_SPARK_MASTER": "local[1]",
    }
    worker = Worker(subscriptions=[audit.name], install_signal_handlers=False)
    thread = threading.Thread(target=lambda: (worker.run(), connection.close()))
    thread.start()
    try:
        wait_for(
            lambda: Archive.objects.filter(status="archived").count() == 2,
            timeout=300,
            interval=0.5,
            message="a periodic archive run archives both due partitions",
        )
    finally:
        worker.stop()
        thread.join(timeout=60)
        child = worker.sources[0].archive.child
        if child is not None:
            child.wait(timeout=120)  # it finishes its run after the worker stopped
    assert {spread["oldest"][0], spread["older"][0]}.isdisjoint(_partition_names())
    in_parquet = _parquet_rows(tmp_path / spread["oldest"][0]) | _parquet_rows(
        tmp_path / spread["older"][0]
    )
    assert in_parquet | _all_rows() == everything
    assert not in_parquet & _all_rows()
    # The subscription handled every event before its partition went.
    assert Effect.objects.filter(channel="sub.audit").count() == len(everything)
