"""The notification claim's index read: statistics that make it sort every pending row are
refreshed by the worker (refresh_statistics), and a claim that starts past the last batch does
not leave rows behind (NotificationSource._claim)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

import pgmsg
from pgmsg.channels import source
from pgmsg_dev.devdb import database_url
from pgmsg_tests.testapp.channels import Work
from pgmsg_tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

BACKLOG = 3000
CLAIM = {"channels": ["test.work"], "limit": 100, "from_id": 0}


def sorts() -> bool:
    with connection.cursor() as cursor:
        return source.sorts_to_claim(cursor, CLAIM)


def common_channels() -> list[str]:
    """The channels ANALYZE last found common in pgmsg_notification. Written by ANALYZE in its
    own transaction (pg_statistic), unlike pg_stat_user_tables' analyze_count, which the
    analyzing session reports up to a second or more later."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT most_common_vals::text::text[] FROM pg_stats "
            "WHERE tablename = 'pgmsg_notification' AND attname = 'channel'"
        )
        return cursor.fetchone()[0] or []


def test_statistics_of_other_channels_rows_are_refreshed_and_the_claim_reads_in_order():
    with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as conn:
        # Statistics taken while the table held only another channel's rows: to the planner,
        # test.work's rows look rare (as after a drained queue of one channel, then a burst of
        # another). Those rows lay out of id order in the heap (as once vacuum has freed the
        # queue's pages for new rows), so that reading the primary key looks dear.
        conn.execute(
            "INSERT INTO pgmsg_notification (id, channel, payload) "
            "SELECT 1000000000 + i, 'test.elsewhere', '{}' FROM generate_series(1, %s) AS i "
            "ORDER BY random()",
            [BACKLOG],
        )
        conn.execute("ANALYZE pgmsg_notification")
        conn.execute("DELETE FROM pgmsg_notification")
        conn.execute(
            "INSERT INTO pgmsg_notification (channel, payload) "
            "SELECT 'test.work', jsonb_build_object('key', 'backlog-' || i) "
            "FROM generate_series(1, %s) AS i",
            [BACKLOG],
        )
    assert sorts()  # the trap: each batch would sort every pending row
    assert common_channels() == ["test.elsewhere"]

    pgmsg.Worker(channel_names=["test.work"], until_idle=True).run()

    handled = Effect.objects.filter(listener="record_work", key__startswith="backlog-")
    assert handled.count() == BACKLOG
    assert common_channels() == ["test.work"]  # analyzed while its rows were pending
    assert not sorts()


def test_a_row_below_where_claims_start_is_not_left_behind(monkeypatch):
    """While batches come back full, a claim starts past the last batch (the index entries of
    the rows deleted before it lie at the index's head until vacuum). A row that appears below
    that point (here: a transaction that inserted it early and commits late) is claimed as soon
    as a batch comes back short."""
    monkeypatch.setattr(source, "FROM_START_INTERVAL", 3600.0)
    late = psycopg.connect(database_url(connection.settings_dict))
    late.execute(
        "INSERT INTO pgmsg_notification (channel, payload) "
        "VALUES ('test.work', '{\"key\": \"late\"}')"
    )
    pgmsg.notify_many(Work(key=f"w{i}") for i in range(250))
    worker = pgmsg.Worker(channel_names=["test.work"], batch_size=100)
    [notifications] = worker.sources

    assert notifications.process_batch(worker) == 100
    late.commit()  # its row's id is below every id claimed so far
    late.close()
    assert notifications.process_batch(worker) == 100  # starts past the first batch
    assert not Effect.objects.filter(key="late").exists()
    assert notifications.process_batch(worker) == 51  # 50 past it, then from the start
    handled = Effect.objects.filter(listener="record_work")
    assert handled.filter(key="late").count() == 1 and handled.count() == 251


def test_a_batch_rolled_back_for_a_failure_is_claimed_again_with_savepoints(monkeypatch):
    """A handler's failure on the fast path rolls the batch back (batch.Redo) and the worker
    claims again with a savepoint per row: the same rows, wherever the failed claim started,
    so that the failure is recorded and the others commit at once, not rolled back again each
    time a later claim from the start reaches them."""
    monkeypatch.setattr(source, "FROM_START_INTERVAL", 3600.0)
    pgmsg.notify_many(Work(key=f"r{i}", fail_times=1 if i == 102 else 0) for i in range(300))
    worker = pgmsg.Worker(channel_names=["test.work"], batch_size=100)
    [notifications] = worker.sources
    assert worker.process(notifications) == 100  # r0..r99, claimed from the start
    assert worker.process(notifications) == 100  # past them: r102 fails, the batch is redone
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT payload->>'key', attempts FROM pgmsg_notification WHERE channel = 'test.work'"
        )
        pending = dict(cursor.fetchall())
    assert pending.pop("r102") == 1  # its failure recorded, a retry scheduled
    assert sorted(pending, key=lambda key: int(key[1:])) == [f"r{i}" for i in range(200, 300)]


@pytest.mark.wire_fast_path
def test_the_claim_is_prepared_and_a_deallocation_behind_its_back_loses_nothing():
    """The claim runs as a statement prepared on the worker's connection (wire.opening_rows'
    prepare). After a DEALLOCATE ALL there (by a handler, say) the next claim finds it gone,
    rolls back its BEGIN and prepares it anew: every message is handled once."""
    pgmsg.notify_many(Work(key=f"d{i}") for i in range(250))
    worker = pgmsg.Worker(channel_names=["test.work"], batch_size=100, until_idle=True)
    [notifications] = worker.sources
    assert notifications.process_batch(worker) == 100

    def prepared_claims() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_prepared_statements "
                "WHERE statement LIKE '%%DELETE FROM pgmsg_notification%%'"
            )
            return cursor.fetchone()[0]

    assert prepared_claims() == 1
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    assert prepared_claims() == 0
    worker.run()  # until idle: an error the claim met would be raised here
    handled = Effect.objects.filter(listener="record_work")
    assert handled.count() == 250
    assert handled.values("key").distinct().count() == 250
