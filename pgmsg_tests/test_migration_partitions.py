"""The migration path: a database made by the migrations before the partitioned layout keeps
every row through ``migrate``, and works as before afterwards."""

import os
import subprocess
import sys
import uuid

import psycopg
import pytest
from django.db import connection

from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

#: Suffix of the scratch database's name: named after the test database, so that two runs on
#: one shared server (each with its own test database) do not drop each other's.
SCRATCH = "_migration_path"
BEFORE = "0013_inbox_version_when_done"


def _migrate(url: str, *target: str) -> None:
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "pgmsg_tests.settings"}
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", *target, "-v", "0"],
        cwd=ROOT, env=env, check=True, timeout=300,
    )  # fmt: skip


@pytest.fixture
def scratch_url():
    name = connection.settings_dict["NAME"] + SCRATCH
    with connection.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')
        cursor.execute(f'CREATE DATABASE "{name}"')
    yield database_url(connection.settings_dict, name=name)
    with connection.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _rows(db, query: str, params: list | None = None) -> list[tuple]:
    return db.execute(query, params).fetchall()


def test_migrate_converts_a_database_of_the_plain_layout_keeping_every_row(scratch_url):
    _migrate(scratch_url, "pgmsg", BEFORE)
    event_ids = [uuid.uuid4() for _ in range(3)]
    with psycopg.connect(scratch_url, autocommit=True) as db:
        db.execute(
            "INSERT INTO pgmsg_inbox_message (inbox, message_id, type, payload, status, "
            "received_at, processed_at) VALUES "
            "('hooks', 'a', 't', '{}', 'processed', now() - interval '40 days', now()), "
            "('hooks', 'b', 't', '{\"x\": 1}', 'pending', now(), NULL)"
        )
        db.execute(
            "INSERT INTO pgmsg_stream (name, version, transaction_id) "
            "VALUES ('order-1', 3, pg_current_xact_id())"
        )
        for version, message_id in enumerate(event_ids, start=1):
            db.execute(
                "INSERT INTO pgmsg_event (stream_name, category, version, type, data, metadata, "
                "message_id, recorded_at) VALUES ('order-1', 'order', %s, 't', '{}', '{}', %s, "
                "now() - make_interval(days => %s))",
                [version, message_id, 70 - version * 30],
            )
        inbox_before = _rows(db, "SELECT * FROM pgmsg_inbox_message ORDER BY id")
        events_before = _rows(db, "SELECT * FROM pgmsg_event ORDER BY position")

    _migrate(scratch_url)

    with psycopg.connect(scratch_url, autocommit=True) as db:
        kinds = dict(
            _rows(
                db,
                "SELECT relname, relkind FROM pg_class "
                "WHERE relname IN ('pgmsg_inbox_message', 'pgmsg_event')",
            )
        )
        assert kinds == {"pgmsg_inbox_message": "p", "pgmsg_event": "p"}
        assert _rows(db, "SELECT * FROM pgmsg_inbox_message ORDER BY id") == inbox_before
        assert _rows(db, "SELECT * FROM pgmsg_event ORDER BY position") == events_before
        # Old rows sit in the partitions of their own month or week (UTC).
        assert not _rows(
            db,
            "SELECT position FROM pgmsg_event WHERE tableoid::regclass::text "
            "<> 'pgmsg_event_p' || to_char(recorded_at AT TIME ZONE 'UTC', 'YYYYMM')",
        )
        assert not _rows(
            db,
            "SELECT id FROM pgmsg_inbox_message WHERE tableoid::regclass::text "
            "<> 'pgmsg_inbox_message_p' "
            "|| to_char(date_trunc('week', received_at AT TIME ZONE 'UTC'), 'YYYYMMDD')",
        )
        # Idempotency holds for rows from before; new ids follow the old ones.
        assert not _rows(
            db,
            "INSERT INTO pgmsg_inbox_message (inbox, message_id, type, payload) "
            "VALUES ('hooks', 'a', 't', '{}') RETURNING id",
        )
        (new_id,) = _rows(
            db,
            "INSERT INTO pgmsg_inbox_message (inbox, message_id, type, payload) "
            "VALUES ('hooks', 'c', 't', '{}') RETURNING id",
        )[0]
        assert new_id > max(row[0] for row in inbox_before)
        with pytest.raises(psycopg.errors.UniqueViolation, match="is stored already"):
            _rows(
                db,
                "INSERT INTO pgmsg_event (stream_name, category, version, type, data, "
                f"metadata, message_id) VALUES ('order-2', 'order', 1, 't', '{{}}', '{{}}', "
                f"'{event_ids[0]}') RETURNING position",
            )


def test_migrate_converts_the_outbox_of_the_plain_layout_keeping_every_row(scratch_url):
    _migrate(scratch_url, "pgmsg", "0015_storage_retention_receipts_archive")
    with psycopg.connect(scratch_url, autocommit=True) as db:
        db.execute(
            "INSERT INTO pgmsg_outbox_message (outbox, message_id, destination, topic, type, "
            "key, payload, status, attempts, created_at) VALUES "
            "('orders', 'old', 'rabbit', 'o', 't', 'k', '{}', 'pending', 0, "
            " now() - interval '40 days'), "
            "('orders', 'dead', 'rabbit', 'o', 't', 'k', '{\"x\": 1}', 'dead', 3, "
            " now() - interval '9 days'), "
            "('orders', 'new', 'rabbit', 'o', 't', NULL, '{}', 'pending', 0, now()), "
            "('orders', 'relayed', 'rabbit', 'o', 't', NULL, '{}', 'pending', 0, now())"
        )
        # The relay deleted the newest row: its id must not be handed out again.
        (issued,) = _rows(db, "DELETE FROM pgmsg_outbox_message WHERE message_id = 'relayed' "
                              "RETURNING id")[0]  # fmt: skip
        outbox_before = _rows(db, "SELECT * FROM pgmsg_outbox_message ORDER BY id")

    _migrate(scratch_url)

    with psycopg.connect(scratch_url, autocommit=True) as db:
        assert _rows(db, "SELECT relkind FROM pg_class WHERE relname = 'pgmsg_outbox_message'") == [
            ("p",)
        ]
        assert _rows(db, "SELECT * FROM pgmsg_outbox_message ORDER BY id") == outbox_before
        assert not _rows(
            db,
            "SELECT id FROM pgmsg_outbox_message WHERE tableoid::regclass::text "
            "<> 'pgmsg_outbox_message_p' "
            "|| to_char(date_trunc('week', created_at AT TIME ZONE 'UTC'), 'YYYYMMDD')",
        )
        # Idempotency holds for rows from before, whichever week holds them; ids go on.
        for message_id in ("old", "dead", "new"):
            assert not _rows(
                db,
                "INSERT INTO pgmsg_outbox_message (outbox, message_id, destination, topic, "
                "type, payload) VALUES ('orders', %s, 'rabbit', 'o', 't', '{}') RETURNING id",
                [message_id],
            )
        (new_id,) = _rows(
            db,
            "INSERT INTO pgmsg_outbox_message (outbox, message_id, destination, topic, type, "
            "payload) VALUES ('orders', 'relayed', 'rabbit', 'o', 't', '{}') RETURNING id",
        )[0]
        assert new_id > issued
        # The wake trigger came back with the table.
        assert _rows(
            db,
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'pgmsg_outbox_message'::regclass "
            "AND tgname LIKE 'pgtrigger_pgmsg_outbox_%'",
        ) == [(2,)]


def test_migrate_moves_dead_notifications_to_their_table_keeping_ids_and_back(scratch_url):
    _migrate(scratch_url, "pgmsg", "0029_read_reports_crashes")
    with psycopg.connect(scratch_url, autocommit=True) as db:
        db.execute(
            "INSERT INTO pgmsg_notification (channel, payload, status, attempts, last_error, "
            "last_failed_at) VALUES "
            "('work', '{\"k\": 1}', 'pending', 0, '', NULL), "
            "('work', '{\"k\": 2}', 'dead', 5, 'Traceback\n  boom', now()), "
            "('work', '{\"k\": 3}', 'pending', 2, 'once', now()), "
            "('mail', '{\"k\": 4}', 'dead', 1, 'bad payload', now())"
        )
        columns = "id, channel, payload, attempts, created_at, last_error, last_failed_at"
        before = _rows(db, f"SELECT {columns}, status FROM pgmsg_notification ORDER BY id")

    _migrate(scratch_url, "pgmsg", "0030_dead_letters_apart")

    with psycopg.connect(scratch_url, autocommit=True) as db:
        pending = _rows(db, f"SELECT {columns} FROM pgmsg_notification ORDER BY id")
        dead = _rows(db, f"SELECT {columns} FROM pgmsg_notification_dead ORDER BY id")
        assert pending == [row[:-1] for row in before if row[-1] == "pending"]
        assert dead == [row[:-1] for row in before if row[-1] == "dead"]
        indexes = _rows(
            db,
            "SELECT indexname FROM pg_indexes WHERE tablename = 'pgmsg_notification' "
            "ORDER BY indexname",
        )
        assert indexes == [("pgmsg_notification_pkey",), ("pgmsg_notification_retrying",)]
        stored = _rows(db, f"SELECT {columns}, status FROM pgmsg_notification_stored ORDER BY id")
        assert stored == before

    # And back: the dead rows return to the one table with status 'dead'.
    _migrate(scratch_url, "pgmsg", "0029_read_reports_crashes")
    with psycopg.connect(scratch_url, autocommit=True) as db:
        again = _rows(db, f"SELECT {columns}, status FROM pgmsg_notification ORDER BY id")
        assert again == before
