"""Parquet export: every value round-trips, incremental runs are exact and gap-free, failures
leave watermarks alone. Parquet is read back with pyarrow, independently of Spark."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import os
import re
import subprocess
import sys
import threading
import uuid

import pyarrow as pa
import pyarrow.dataset as pads
import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections, transaction

import pgmsg
from pgmsg import export
from pgmsg.core import errors, locks
from pgmsg.export import tables
from pgmsg.models import ExportWatermark, InboxMessage, Notification, NotificationDeadLetter
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import ROOT
from pgmsg_tests.export.helpers import (
    assert_same_rows,
    latest_versions,
    read_dataset,
    settle,
    watermark_row,
)
from pgmsg_tests.helpers import drain, make_dead
from pgmsg_tests.testapp.channels import Unheard, Work

pytestmark = pytest.mark.django_db(transaction=True)

INBOX = "test.export"


def pgmsg_inbox():
    from pgmsg.inbox import declarations as inbox_module

    return inbox_module


@pytest.fixture
def inbox():
    from pgmsg.inbox import declarations as inbox_module

    if INBOX not in inbox_module.registry.inboxes:
        pgmsg.Inbox(INBOX)
    return inbox_module


# -- without Spark ----------------------------------------------------------------------------


def test_split_range_covers_every_key_once():
    assert export.split_range(1, 10, 3) == [(1, 3), (4, 7), (8, 10)]
    assert export.split_range(5, 6, 4) == [(5, 5), (6, 6)]
    assert export.split_range(7, 7, 1) == [(7, 7)]
    ranges = export.split_range(-3, 1_000_003, 7)
    assert ranges[0][0] == -3 and ranges[-1][1] == 1_000_003
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))


@pytest.mark.parametrize(
    "options, quoted",
    [
        ({"partition_by": "week"}, "'week'"),
        ({"mode": "upsert"}, "'upsert'"),
        ({"partitions": 0}, "0"),
        ({"flatten": ["a-b"]}, "'a-b'"),
        ({"tables": ["nope"]}, "'nope'"),
        ({"tables": ["notifications"], "partition_by": "category"}, "category"),
    ],
)
def test_bad_options_are_refused_quoting_the_bad_value(tmp_path, options, quoted):
    pgmsg.notify(Unheard(key="x"))
    with pytest.raises(errors.ExportError, match=quoted):
        export.export_tables(str(tmp_path / "out"), **options)
    assert not (tmp_path / "out").exists()
    assert not ExportWatermark.objects.exists()


def test_dry_run_says_what_would_be_exported_and_writes_nothing(tmp_path, inbox):
    pgmsg.notify_many(Unheard(key=f"k{i}") for i in range(7))
    inbox.receive_many(
        INBOX, [{"message_id": f"m{i}", "type": "t", "payload": {"i": i}} for i in range(5)]
    )
    settle("pgmsg_inbox_message")
    lines = []
    summary = export.export_tables(
        str(tmp_path / "out"),
        dry_run=True,
        partitions=2,
        echo=lines.append,
        tables=["notifications", "inbox_messages"],
    )
    by_name = {p.spec.name: p for p in summary.plans}
    assert by_name["notifications"].rows == 7 and by_name["inbox_messages"].rows == 5
    assert len(by_name["notifications"].read.ranges) == 2
    assert any("would export notifications" in line and "7 row(s)" in line for line in lines)
    assert any(
        "would export inbox_messages" in line and "transaction_id >= 0" in line for line in lines
    )
    assert not (tmp_path / "out").exists()
    assert not ExportWatermark.objects.exists()

    call_command(
        "pgmsg_export",
        "--output",
        str(tmp_path / "out"),
        "--dry-run",
        "--tables",
        "notifications",
        stdout=(out := io.StringIO()),
    )
    assert "would export notifications (pgmsg_notification_stored): 7 row(s)" in out.getvalue()
    assert "dry run: nothing written, no watermark moved" in out.getvalue()
    assert not (tmp_path / "out").exists()


def test_missing_java_names_what_to_install(tmp_path, monkeypatch):
    pgmsg.notify(Unheard(key="x"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(errors.JavaMissing, match="Java 17 or later.*install"):
        export.export_tables(str(tmp_path / "out"))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nojava"))
    with pytest.raises(errors.JavaMissing, match="nojava"):
        export.java_command()
    assert not ExportWatermark.objects.exists()


def test_unreachable_database_is_a_clear_command_error(tmp_path):
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="pgmsg_tests.settings",
        DATABASE_URL="postgres://postgres@127.0.0.1:1/nowhere",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "django", "pgmsg_export", "--output", str(tmp_path / "out")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "CommandError: export: cannot reach database 'default'" in proc.stderr
    assert not (tmp_path / "out").exists()


# -- with Spark -------------------------------------------------------------------------------


@pytest.mark.spark
def test_notifications_round_trip_every_value_through_parquet(spark, tmp_path):
    keys = ["plain", "", 'quote " comma , newline \n end', "ünïcødé ✓", "x" * 20_000]
    pgmsg.notify_many(Work(key=k) for k in keys)
    pgmsg.notify_many(Unheard(key=f"u{i}") for i in range(40))
    failed_at = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
    make_dead(
        Notification.objects.filter(channel="test.work").values_list("pk", flat=True),
        attempts=5,
        last_error="Traceback\n  boom",
        last_failed_at=failed_at,
    )
    summary = export.export_tables(
        str(tmp_path), spark=spark, tables=["notifications"], partitions=3, flatten=["key"]
    )
    [result] = summary.results
    days = {d.date() for d in Notification.objects.values_list("created_at", flat=True)} | {
        d.date() for d in NotificationDeadLetter.objects.values_list("created_at", flat=True)
    }
    assert result.rows == 45 and result.files == 3 * len(days) and result.bytes > 0
    assert watermark_row("notifications").transaction_xmin is None  # a snapshot table

    rows = read_dataset(tmp_path / "notifications")
    # The view of pending and dead notifications, with their status (migration 0030).
    assert_same_rows(rows, "pgmsg_notification_stored", "id", flatten=["key"], payload="payload")
    assert sorted(r["status"] for r in rows) == ["dead"] * len(keys) + ["pending"] * 40
    for row in rows:
        assert row["day"] == row["created_at"].date().isoformat()
    schema = pads.dataset(str(tmp_path / "notifications"), format="parquet").schema
    assert schema.field("id").type == pa.int64()
    assert schema.field("attempts").type == pa.int32()
    assert schema.field("created_at").type == pa.timestamp("us", tz="UTC")
    assert schema.field("payload").type == pa.string()


@pytest.mark.spark
def test_inbox_incremental_runs_export_exactly_the_new_rows(spark, tmp_path, inbox):
    def receive(ids):
        inbox.receive_many(
            INBOX,
            [
                {
                    "message_id": f"m{i}",
                    "type": f"t{i % 3}",
                    "payload": {"i": i, "n": None},
                    "aggregate_id": None if i % 2 else f"agg{i}",
                    "source": "" if i % 4 else "src",
                }
                for i in ids
            ],
        )

    receive(range(30))
    settle("pgmsg_inbox_message")
    first = export.export_tables(
        str(tmp_path),
        spark=spark,
        tables=["inbox_messages"],
        partitions=2,
        partition_by="type",
        flatten=["i"],
    )
    mark = watermark_row("inbox_messages").transaction_xmin
    assert first.results[0].rows == 30 and mark == first.results[0].watermark
    receive(range(30, 50))
    settle("pgmsg_inbox_message")
    second = export.export_tables(
        str(tmp_path),
        spark=spark,
        tables=["inbox_messages"],
        partitions=2,
        partition_by="type",
        flatten=["i"],
    )
    assert second.results[0].rows == 20
    assert second.plans[0].transaction_range[0] == mark
    rows = read_dataset(tmp_path / "inbox_messages")
    assert_same_rows(rows, "pgmsg_inbox_message", "id", flatten=["i"], payload="payload")

    nothing = export.export_tables(
        str(tmp_path), spark=spark, tables=["inbox_messages"], partition_by="type"
    )
    assert nothing.results[0].rows == 0 and nothing.results[0].files == 0
    full = export.export_tables(
        str(tmp_path), spark=spark, tables=["inbox_messages"], partition_by="none", full=True
    )
    assert full.plans[0].mode == "overwrite" and full.results[0].rows == 50
    assert_same_rows(read_dataset(tmp_path / "inbox_messages"), "pgmsg_inbox_message", "id")


@pytest.mark.spark
def test_a_late_committing_writer_is_exported_by_the_next_run(spark, tmp_path, inbox):
    inbox.receive(INBOX, "early", type="t", payload={})
    settle("pgmsg_inbox_message")
    holding, release = threading.Event(), threading.Event()
    failures = []

    def late_writer():
        try:
            with transaction.atomic():
                inbox.receive(INBOX, "late", type="t", payload={})
                holding.set()
                release.wait(120)
        except Exception as exc:  # reported by the main thread
            failures.append(exc)
            holding.set()
        finally:
            connections.close_all()

    writer = threading.Thread(target=late_writer)
    writer.start()
    try:
        assert holding.wait(60) and not failures
        inbox.receive(INBOX, "after", type="t", payload={})  # committed, higher id than "late"
        first = export.export_tables(str(tmp_path), spark=spark, tables=["inbox_messages"])
    finally:
        release.set()
        writer.join(60)
    assert not failures
    first_ids = {r["message_id"] for r in read_dataset(tmp_path / "inbox_messages")}
    # "after" committed, but a transaction below it was still open: it waits for the next run,
    # or an id watermark would now stand above "late" and skip it forever.
    assert first_ids == {"early"} and first.results[0].rows == 1

    settle("pgmsg_inbox_message")
    second = export.export_tables(str(tmp_path), spark=spark, tables=["inbox_messages"])
    assert second.results[0].rows == 2
    rows = read_dataset(tmp_path / "inbox_messages")
    assert sorted(r["message_id"] for r in rows) == ["after", "early", "late"]


@pytest.mark.spark
def test_a_failed_run_leaves_the_watermark_where_it_was(spark, tmp_path, inbox):
    inbox.receive_many(
        INBOX, [{"message_id": f"a{i}", "type": "t", "payload": i} for i in range(5)]
    )
    settle("pgmsg_inbox_message")
    export.export_tables(str(tmp_path), spark=spark, tables=["inbox_messages"])
    before = watermark_row("inbox_messages")
    inbox.receive_many(
        INBOX, [{"message_id": f"b{i}", "type": "t", "payload": i} for i in range(3)]
    )
    settle("pgmsg_inbox_message")

    # The executors cannot reach PostgreSQL: Spark's read fails after planning.
    unreachable = database_url(connection.settings_dict, name="pgmsg_export_no_such_db")
    with pytest.raises(errors.ExportError, match="watermark is unchanged"):
        export.export_tables(
            str(tmp_path), spark=spark, tables=["inbox_messages"], database_url=unreachable
        )
    # The output path is a file: refused before anything is read.
    blocker = tmp_path / "blocked"
    blocker.write_text("not a directory")
    with pytest.raises(errors.ExportError, match="not writable"):
        export.export_tables(str(blocker / "out"), spark=spark, tables=["inbox_messages"])
    after = watermark_row("inbox_messages")
    assert (after.transaction_xmin, after.total_rows) == (before.transaction_xmin, 5)

    retry = export.export_tables(str(tmp_path), spark=spark, tables=["inbox_messages"])
    assert retry.results[0].rows == 3
    ids = sorted(r["message_id"] for r in read_dataset(tmp_path / "inbox_messages"))
    assert ids == sorted([f"a{i}" for i in range(5)] + [f"b{i}" for i in range(3)])


@pytest.mark.spark
def test_events_round_trip_partitioned_by_category(spark, tmp_path):
    events = pytest.importorskip("pgmsg.events.store")

    class Deposited(events.Event, type="export.deposited"):
        amount: int
        note: str

    correlation = str(uuid.uuid4())
    for n in range(3):
        events.append(
            f"account-{n}",
            [
                Deposited(
                    amount=n * 10 + i, note=f'n,"{i}"\n', metadata={"correlation_id": correlation}
                )
                for i in range(4)
            ],
        )
    events.append("ledger-1", Deposited(amount=-1, note=""))
    settle("pgmsg_event")
    summary = export.export_tables(
        str(tmp_path),
        spark=spark,
        tables=["events"],
        partitions=2,
        partition_by="category",
        flatten=["amount"],
    )
    assert summary.results[0].rows == 13
    listing = [name for name in os.listdir(tmp_path / "events") if not name.startswith(".")]
    assert sorted(listing) == ["_SUCCESS", "category=account", "category=ledger"]
    rows = read_dataset(tmp_path / "events")
    assert_same_rows(rows, "pgmsg_event", "position", flatten=["amount"], payload="data")
    assert watermark_row("events").transaction_xmin == summary.results[0].watermark


@pytest.mark.spark
def test_the_command_exports_and_prints_a_summary(spark, tmp_path, capsys):
    pgmsg.notify_many(Unheard(key=f"c{i}") for i in range(4))
    call_command(
        "pgmsg_export",
        "--output",
        str(tmp_path),
        "--tables",
        "notifications",
        "--partition-by",
        "type",
        "--mode",
        "overwrite",
    )
    out = capsys.readouterr().out
    assert "exported 4 row(s) of 1 table(s): 1 file(s)" in out
    rows = read_dataset(tmp_path / "notifications")
    assert sorted(json.loads(r["payload"])["key"] for r in rows) == [f"c{i}" for i in range(4)]
    assert {r["channel"] for r in rows} == {"test.unheard"}


def test_blocks_end_on_row_boundaries_even_when_a_row_is_larger(tmp_path):
    from pgmsg.export.reading import read_range

    keys = ["a\nb", "x" * 50_000, '"', "", "ok"] * 3
    pgmsg.notify_many(Unheard(key=k) for k in keys)
    [table_plan] = export.plan(str(tmp_path), tables=["notifications"], partitions=1)
    small = dataclasses.replace(table_plan.read, block_size=1000)
    lo, hi = table_plan.key_range
    batches = list(read_range(small, lo, hi))
    assert len(batches) > 3
    rows = [row for batch in batches for row in batch.to_pylist()]
    assert [json.loads(r["payload"])["key"] for r in rows] == keys
    assert_same_rows(rows, "pgmsg_notification_stored", "id")


@pytest.mark.spark
def test_a_snapshot_export_of_an_emptied_table_empties_the_dataset(spark, tmp_path):
    pgmsg.notify(Work(key="handled soon"))
    first = export.export_tables(str(tmp_path), spark=spark, tables=["notifications"])
    assert first.results[0].rows == 1 and len(read_dataset(tmp_path / "notifications")) == 1
    drain()  # handled notifications are deleted
    second = export.export_tables(str(tmp_path), spark=spark, tables=["notifications"])
    assert second.plans[0].mode == "overwrite" and second.results[0].rows == 0
    assert read_dataset(tmp_path / "notifications") == []


def test_a_second_export_on_the_same_database_is_refused_while_one_runs(tmp_path):
    import psycopg

    with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(hashtext(%s))", [locks.EXPORT_BATCH])
        with pytest.raises(errors.ExportError, match="another pgmsg export is running"):
            export.export_tables(str(tmp_path), dry_run=True)
        other.execute("SELECT pg_advisory_unlock(hashtext(%s))", [locks.EXPORT_BATCH])
    assert export.export_tables(str(tmp_path), dry_run=True).dry_run


def test_every_column_kind_reads_back_as_its_value_and_type(tmp_path):
    from pgmsg.export.reading import read_range

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE export_kinds (id bigint PRIMARY KEY, i integer, s smallint, b boolean,"
            " f float8, d date, ts timestamptz, naive timestamp, j jsonb, u uuid, n numeric,"
            " t text, x xid8, made timestamptz NOT NULL DEFAULT now())"
        )
    spec = export.register(
        export.TableSpec(
            name="kinds",
            table="export_kinds",
            key="id",
            timestamp="made",
            payload_column="j",
            transaction_column="x",
        )
    )
    try:
        ident = uuid.uuid4()
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO export_kinds (id, i, s, b, f, d, ts, naive, j, u, n, t, x) VALUES "
                "(1, -2147483648, 32767, true, -1.5e300, '1969-12-31', "
                " '1901-02-03 04:05:06.789012+05', '2040-01-01 00:00:00.000001', "
                ' \'{"k": [1, "\\u00e9"], "e": ""}\', %s, 1.10, \'\', \'5\'),'
                "(2, NULL, NULL, false, NULL, NULL, NULL, NULL, 'null', NULL, NULL, NULL, '6')",
                [ident],
            )
        [table_plan] = export.plan(str(tmp_path), tables=["kinds"], flatten=["k", "e"])
        assert table_plan.rows == 2  # transaction ids 5 and 6: long settled
        lo, hi = table_plan.key_range
        [table] = [pa.Table.from_batches(list(read_range(table_plan.read, lo, hi)))]
        types = {f.name: f.type for f in table.schema}
        assert types == {
            "id": pa.int64(),
            "i": pa.int32(),
            "s": pa.int32(),
            "b": pa.bool_(),
            "f": pa.float64(),
            "d": pa.date32(),
            "ts": pa.timestamp("us", tz="UTC"),
            "naive": pa.timestamp("us", tz="UTC"),
            "j": pa.string(),
            "u": pa.string(),
            "n": pa.string(),
            "t": pa.string(),
            "x": pa.int64(),
            "made": pa.timestamp("us", tz="UTC"),
            "j_k": pa.string(),
            "j_e": pa.string(),
            "day": pa.date32(),
        }
        first, second = table.to_pylist()
        assert first | {"made": None, "day": None} == {
            "id": 1,
            "i": -2147483648,
            "s": 32767,
            "b": True,
            "f": -1.5e300,
            "d": dt.date(1969, 12, 31),
            "ts": dt.datetime(1901, 2, 2, 23, 5, 6, 789012, tzinfo=dt.UTC),
            "naive": dt.datetime(2040, 1, 1, 0, 0, 0, 1, tzinfo=dt.UTC),
            "j": '{"e": "", "k": [1, "é"]}',
            "u": str(ident),
            "n": "1.10",
            "t": "",
            "x": 5,
            "made": None,
            "j_k": '[1, "é"]',
            "j_e": "",
            "day": None,
        }
        assert first["day"] == first["made"].date()
        assert second | {"made": None, "day": None} == {
            "id": 2,
            "i": None,
            "s": None,
            "b": False,
            "f": None,
            "d": None,
            "ts": None,
            "naive": None,
            "j": "null",
            "u": None,
            "n": None,
            "t": None,
            "x": 6,
            "made": None,
            "j_k": None,
            "j_e": None,
            "day": None,
        }
    finally:
        tables.unregister(spec.name)
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE export_kinds")


def test_a_row_that_fails_mid_copy_fails_the_read_naming_the_table_and_the_reason(tmp_path):
    """The rows come straight from libpq: an error PostgreSQL raises after sending some rows
    must still fail the read (not end it early, silently short of rows)."""
    from pgmsg.export.reading import SourceError, read_range

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE export_bad_rows (id bigint PRIMARY KEY, ts timestamptz, x xid8,"
            " made timestamptz NOT NULL DEFAULT now())"
        )
        cursor.execute(
            "INSERT INTO export_bad_rows (id, ts, x) SELECT i, CASE WHEN i = 3000 THEN"
            " 'infinity' ELSE now() END, '5' FROM generate_series(1, 6000) AS i"
        )
    spec = export.register(
        export.TableSpec(
            name="bad_rows", table="export_bad_rows", key="id", timestamp="made",
            transaction_column="x",
        )
    )  # fmt: skip
    try:
        [table_plan] = export.plan(str(tmp_path), tables=["bad_rows"])
        small = dataclasses.replace(table_plan.read, block_size=1000)  # batches before the error
        lo, hi = table_plan.key_range
        with pytest.raises(SourceError) as failed:
            list(read_range(small, lo, hi))
        message = str(failed.value)
        assert "reading export_bad_rows from PostgreSQL at 'postgresql://" in message
        assert "infinity" in message and "password" not in message
    finally:
        tables.unregister(spec.name)
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE export_bad_rows")


# -- what a broken set-up does ----------------------------------------------------------------


def run_command(*args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="pgmsg_tests.settings",
        DATABASE_URL=database_url(connection.settings_dict),
    )
    return subprocess.run(
        [sys.executable, "-m", "django", "pgmsg_export", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_unreachable_master_is_one_line_and_leaves_nothing_behind(tmp_path):
    pgmsg.notify(Unheard(key="x"))
    proc = run_command("--output", str(tmp_path / "out"), "--master", "spark://127.0.0.1:1")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "CommandError: export: no Spark master answers at spark://127.0.0.1:1 "
        "(127.0.0.1:1: Connection refused): start the master, or give the URL its web UI "
        "shows (spark://HOST:PORT)"
    ]
    assert not (tmp_path / "out").exists()
    assert not ExportWatermark.objects.exists()


@pytest.mark.parametrize(
    "master, quoted",
    [
        ("nonsense://x", "'nonsense://x'"),
        ("spark://host-without-port", "'spark://host-without-port'"),
        ("local[0]", "'local[0]'"),
    ],
)
def test_an_invalid_master_url_is_refused_before_spark_starts(tmp_path, master, quoted):
    with pytest.raises(errors.ExportError, match=f"invalid Spark master {re.escape(quoted)}"):
        export.export_tables(str(tmp_path / "out"), master=master)
    assert not (tmp_path / "out").exists()
    assert not ExportWatermark.objects.exists()


def test_with_nothing_new_a_broken_set_up_still_fails_and_moves_no_watermark(tmp_path, monkeypatch):
    # Nothing to write: incremental tables are empty. A cron job must still see the failure.
    with pytest.raises(errors.ExportError, match="no Spark master answers"):
        export.export_tables(
            str(tmp_path / "out"), tables=["inbox_messages"], master="spark://127.0.0.1:1"
        )
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(errors.JavaMissing, match="Java 17 or later"):
        export.export_tables(str(tmp_path / "out"), tables=["inbox_messages"])
    assert not (tmp_path / "out").exists()
    assert not ExportWatermark.objects.exists()


def test_an_unknown_table_on_the_command_line_is_an_export_error(tmp_path):
    with pytest.raises(CommandError) as raised:
        call_command("pgmsg_export", "--output", str(tmp_path), "--tables", "events", "nope")
    assert str(raised.value) == (
        "export: unknown table(s) ['nope']; registered: "
        "['events', 'inbox_messages', 'notifications']"
    )
    assert not tmp_path.joinpath("events").exists()


# -- mutable rows -------------------------------------------------------------------------------


@pytest.mark.spark
def test_inbox_status_changes_reach_the_lake_as_new_row_versions(spark, tmp_path):
    from pgmsg_tests.inbox.helpers import drain as drain_inbox

    inbox = pgmsg_inbox()
    inbox.receive_many(
        "test.inbox",
        [{"message_id": f"s{i}", "type": "work", "payload": {"i": i}} for i in range(4)]
        + [{"message_id": "bad", "type": "work", "payload": {"fail_times": 9}}],
    )
    settle("pgmsg_inbox_message")
    first = export.export_tables(str(tmp_path), spark=spark, tables=["inbox_messages"])
    assert first.results[0].rows == 5
    assert {r["status"] for r in read_dataset(tmp_path / "inbox_messages")} == {"pending"}

    drain_inbox("test.inbox")  # four processed, "bad" fails (retrying)
    settle("pgmsg_inbox_message")
    second = export.export_tables(str(tmp_path), spark=spark, tables=["inbox_messages"])
    # The four that are done with are new versions; "bad" is retrying (still pending): it keeps
    # its receipt transaction id (the ordered inbox sorts by it), so it is no new version yet.
    assert second.results[0].rows == 4

    rows = read_dataset(tmp_path / "inbox_messages")
    assert len(rows) == 9  # a log of row versions
    current = latest_versions(rows, "id")
    assert {r["message_id"]: r["status"] for r in current} == {
        "s0": "processed",
        "s1": "processed",
        "s2": "processed",
        "s3": "processed",
        "bad": "pending",
    }
    stored = {m.message_id: m.processed_at for m in InboxMessage.objects.filter(status="processed")}
    assert {r["message_id"] for r in current if r["status"] == "processed"} == set(stored)

    InboxMessage.objects.filter(message_id="s0").update(type="work")  # changes nothing
    settle("pgmsg_inbox_message")
    third = export.export_tables(str(tmp_path), spark=spark, tables=["inbox_messages"])
    assert third.results[0].rows == 0  # so it is no new version


def test_a_transaction_open_in_another_database_does_not_hold_the_export_back(tmp_path, inbox):
    """Neither a batch run's plan nor a followed stream's head stops at a transaction of another
    database; one of this database is named by the dry run (its rows wait for a later run)."""
    from pgmsg.export import spark_source
    from pgmsg_tests.events.test_horizon import open_writing_transaction

    other = open_writing_transaction("postgres")
    try:
        inbox.receive_many(
            INBOX, [{"message_id": f"o{i}", "type": "t", "payload": i} for i in range(4)]
        )
        settle("pgmsg_inbox_message")
        lines: list[str] = []
        summary = export.export_tables(
            str(tmp_path / "out"), dry_run=True, tables=["inbox_messages"], echo=lines.append
        )
        [plan] = summary.plans
        assert plan.rows == 4 and summary.blockers == []
        assert not any("held back" in line for line in lines)
        stream = spark_source.PgmsgStreamReader(plan.read)
        replayed = spark_source.PgmsgStreamReader(plan.read)  # as after a restart: nothing planned
        try:
            start = spark_source.offset(0, 0)
            head = stream.latestOffset(start)
            assert head["position"] == InboxMessage.objects.order_by("id").last().id
            # The partitions of the batch just planned (its span kept) and of a replay agree.
            spans = [[(p.lo, p.hi) for p in r.partitions(start, head)] for r in (stream, replayed)]
            assert spans[0] == spans[1] != []
        finally:
            stream.stop()  # Spark calls it when the query ends: it closes the kept connection
            replayed.stop()
    finally:
        other.close()


def test_the_dry_run_names_a_transaction_of_this_database_that_holds_it_back(
    tmp_path, inbox, monkeypatch
):
    from pgmsg.core import horizon
    from pgmsg_tests.events.test_horizon import open_writing_transaction

    monkeypatch.setattr(horizon, "BLOCKED_AFTER", 0.0)
    blocker = open_writing_transaction(connection.settings_dict["NAME"])
    pid = blocker.info.backend_pid
    try:
        inbox.receive(INBOX, "held", type="t", payload={})
        call_command(
            "pgmsg_export",
            "--output",
            str(tmp_path / "out"),
            "--dry-run",
            "--tables",
            "inbox_messages",
            stdout=(out := io.StringIO()),
        )
    finally:
        blocker.close()
    assert "inbox_messages (pgmsg_inbox_message): 0 row(s)" in out.getvalue()
    assert f"read horizon held back by pid {pid}" in out.getvalue()
    assert "idle in transaction" in out.getvalue()
