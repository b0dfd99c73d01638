"""The claim record sent ahead (claims.send_record): it commits without its answer being read,
counts crashes as the synchronous call did, and leaves the worker's side connection (which
also LISTENs) as it found it, whatever happens while the answer is on its way."""

import time

import psycopg
import pytest
from django.db import connection

from pgmsg.core import claims
from pgmsg.core.wake import WAKE_CHANNEL
from pgmsg.core.worker import Worker
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker():
    worker = Worker(channel_names=["test.work"], install_signal_handlers=False)
    worker._connect_listener()  # the side connection, LISTENing, as a running worker has it
    yield worker
    worker._close()


def aborted_transaction_id() -> int:
    with psycopg.connect(database_url(connection.settings_dict)) as conn:
        xid = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]
        conn.rollback()
    return xid


def committed_transaction_ids(count: int) -> list[int]:
    with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as conn:
        return [
            conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]
            for _ in range(count)  # in autocommit each SELECT that assigns an id commits
        ]


def claim_rows(xid: int) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT kind, ids FROM pgmsg_claim WHERE transaction_id = %s", [xid])
        return cursor.fetchall()


def test_a_record_commits_before_its_answer_is_read(worker):
    # A worker killed while it decodes its batch must have left its record behind.
    xid = aborted_transaction_id() + 1_000_000  # no such transaction yet: never committed
    record = claims.send_record(worker, "test", [1, 2, 3], xid)
    wait_for(lambda: claim_rows(xid), timeout=30, message="the record, committed")
    assert claim_rows(xid) == [("test", [1, 2, 3])]
    assert record.crashes() == {}
    assert worker.last_claim == xid


def test_the_answer_names_the_suspects_and_charges_crashes_only_to_rows_that_ran_alone(worker):
    died = aborted_transaction_id()
    with claims.send_record(worker, "test", [10, 11, 12], died) as record:
        assert record.crashes() == {}
    died_again = aborted_transaction_id()
    # Rows of a batch of several that died: suspects, but nobody's crash.
    with claims.send_record(worker, "test", [11, 12], died_again) as record:
        assert record.crashes() == {11: 0, 12: 0}
    with claims.send_record(worker, "test", [12], aborted_transaction_id()) as record:
        assert record.crashes() == {12: 0}
    # 12 died alone: charged once; a batch narrowed to one row ran it alone too.
    with claims.send_record(worker, "test", [12, 13], aborted_transaction_id()) as record:
        assert record.crashes() == {12: 1}
    claims.narrow(worker, "test", [12], worker.last_claim)
    with claims.send_record(worker, "test", [12, 13], aborted_transaction_id() + 1) as record:
        assert record.crashes() == {12: 2}
    assert claims.record_and_count(worker, "other", [12], died + 1_000_000) == {}


def test_a_catch_up_batch_is_recorded_uncompressed_and_counted(worker):
    # A subscription's batch of 1,000 events names 1,000 ids (8 KB): PostgreSQL's default
    # storage would spend most of the record's server time compressing it (migration 0025).
    ids = claims.number_keys("test-catch-up", range(5_000, 7_000))
    died = aborted_transaction_id()
    assert claims.record_and_count(worker, "event", ids, died) == {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT cardinality(ids), pg_column_compression(ids), pg_column_size(ids) "
            "FROM pgmsg_claim WHERE transaction_id = %s",
            [died],
        )
        # As sent: 2,000 x 8 bytes and a 20-byte header, not compressed.
        assert cursor.fetchall() == [(2_000, None, 16_020)]
    again = claims.record_and_count(worker, "event", ids[1_000:], aborted_transaction_id())
    assert again == dict.fromkeys(ids[1_000:], 0)  # suspects: that batch ran 2,000 events


def test_an_error_is_raised_as_psycopg_raises_it_and_the_connection_stays_usable(worker):
    record = claims.send_record(worker, "k" * 30, [1], 1)  # pgmsg_claim.kind: varchar(20)
    with pytest.raises(psycopg.errors.StringDataRightTruncation):
        record.crashes()
    side = worker.side_connection()
    assert side.execute("SELECT 1").fetchone() == (1,)


def test_an_answer_left_unread_is_read_at_the_blocks_end(worker):
    with pytest.raises(RuntimeError), claims.send_record(worker, "test", [5], 1):
        raise RuntimeError("decoding the batch failed")
    assert worker.side_connection().execute("SELECT 2").fetchone() == (2,)
    # Also after an error answer that nobody read.
    with pytest.raises(RuntimeError), claims.send_record(worker, "k" * 30, [5], 1):
        raise RuntimeError("decoding the batch failed")
    assert worker.side_connection().execute("SELECT 3").fetchone() == (3,)


def test_a_notification_that_arrives_with_the_answer_reaches_the_next_wait(worker):
    side = worker.side_connection()
    with claims.send_record(worker, "test", [7], 1) as record:
        with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as other:
            other.execute("SELECT pg_notify(%s, 'wake-up while recording')", [WAKE_CHANNEL])
            # The answer is read after the notification has reached the side connection:
            # a pause only orders the two (nothing is timed).
            time.sleep(0.5)
        assert record.crashes() == {}
    got = [n.payload for n in side.notifies(timeout=2, stop_after=1)]
    assert got == ["wake-up while recording"]


def test_a_worker_replaces_its_record_while_its_batches_commit_and_keeps_those_that_died(worker):
    # One row per worker, updated in place: an INSERT and a DELETE per batch left a dead row
    # per batch, which every later record scanned until vacuum (never, without autovacuum).
    for n, xid in enumerate(committed_transaction_ids(600)):
        assert claims.record_and_count(worker, "test", list(range(n, n + 20)), xid) == {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT ids FROM pgmsg_claim")
        assert cursor.fetchall() == [(list(range(599, 619)),)]
        cursor.execute(
            "SELECT pg_relation_size('pgmsg_claim') / current_setting('block_size')::int"
        )
        assert cursor.fetchone()[0] <= 2  # the updates' old versions pruned as the page fills

    died = aborted_transaction_id()
    assert claims.record_and_count(worker, "test", [7, 8], died) == {}
    [after] = committed_transaction_ids(1)
    # A row of its own; 8 a suspect, uncharged (its batch that died ran two rows).
    assert claims.record_and_count(worker, "test", [8, 9], after) == {8: 0}
    assert claim_rows(died) == [("test", [7, 8])]
    assert claim_rows(after) == [("test", [8, 9])]


def test_a_workers_first_record_deletes_the_records_of_committed_batches_only():
    [committed] = committed_transaction_ids(1)
    died = aborted_transaction_id()
    with connection.cursor() as cursor:
        for xid in (committed, died):
            cursor.execute(
                "INSERT INTO pgmsg_claim (kind, ids, transaction_id, pid, alone) "
                "VALUES ('test', '{1}', %s, 1, true)",
                [xid],
            )
    worker = Worker(channel_names=["test.work"], install_signal_handlers=False)
    worker._connect_listener()
    try:
        assert claim_rows(committed) == [("test", [1])]  # connecting touches nothing
        [mine] = committed_transaction_ids(1)
        assert claims.record_and_count(worker, "test", [1, 2], mine) == {1: 1}
        assert claim_rows(committed) == []
        assert claim_rows(died) == [("test", [1])]
        [later] = committed_transaction_ids(1)
        claims.record_and_count(worker, "test", [3], later)  # its own row, replaced
        with connection.cursor() as cursor:
            cursor.execute("SELECT transaction_id FROM pgmsg_claim ORDER BY id")
            assert [row[0] for row in cursor.fetchall()] == [died, later]
    finally:
        worker._close()
