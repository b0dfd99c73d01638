"""A backlog that arrives after pgmsg_notification was analyzed empty: the worker analyzes the
table, so that its claim reads the pending index in id order instead of sorting every pending
row for each batch (channels/source.py, refresh_statistics)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

import pgmsg
from pgmsg.channels.source import QUERIES
from pgmsg_dev.devdb import database_url
from pgmsg_tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

BACKLOG = 3000


def claim_plan() -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN " + QUERIES["claim_notifications"], {"channels": ["test.work"], "limit": 100}
        )
        return "\n".join(row[0] for row in cursor.fetchall())


def analyzed() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'pgmsg_notification'"
        )
        return cursor.fetchone()[0]


def test_a_backlog_after_an_empty_analyze_is_claimed_in_id_order():
    with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as conn:
        conn.execute("ANALYZE pgmsg_notification")  # empty: status = 'pending' looks rare
        conn.execute(
            "INSERT INTO pgmsg_notification (channel, payload) "
            "SELECT 'test.work', jsonb_build_object('key', 'backlog-' || i) "
            "FROM generate_series(1, %s) AS i",
            [BACKLOG],
        )
        conn.execute("SELECT pg_stat_force_next_flush()")  # the counts the check reads
    # The trap the worker avoids: the statistics make the claim sort every pending row.
    assert "Sort" in claim_plan()
    before = analyzed()

    pgmsg.Worker(channel_names=["test.work"], until_idle=True).run()

    handled = Effect.objects.filter(listener="record_work", key__startswith="backlog-")
    assert handled.count() == BACKLOG
    assert analyzed() == before + 1
    plan = claim_plan()
    assert "pgmsg_notification_pending" in plan and "Sort" not in plan, plan
