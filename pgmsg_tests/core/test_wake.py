"""Wake-ups: producers NOTIFY only while a worker is declared idle, and the race is closed."""

from __future__ import annotations

import contextlib

import psycopg
import pytest
from django.db import connection

from pgmsg.channels import sending
from pgmsg.channels.source import ANY_CHANNEL_WAKE, NotificationSource
from pgmsg.core import wake
from pgmsg.models import Notification
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.helpers import effect_counts

pytestmark = pytest.mark.django_db(transaction=True)

INSERT_WORK = "INSERT INTO pgmsg_notification (channel, payload) VALUES ('test.work', %s::jsonb)"
MARKER = "marker"
#: What a worker serving test.work declares itself idle for (NotificationSource).
WORKER_PAYLOADS = ["test.work", ANY_CHANNEL_WAKE]


def connect(**kwargs) -> psycopg.Connection:
    return psycopg.connect(database_url(connection.settings_dict), **kwargs)


def wakes_after(produce, producer: psycopg.Connection | None = None) -> list[str]:
    """The wake payloads a listener receives for what ``produce(conn)`` commits (on
    ``producer``, a non-autocommit connection, or a new one).

    The same session then NOTIFYs a marker; notifications arrive in commit order, so reading
    up to the marker tells, without any timing, whether the producer's commit NOTIFYed.
    """
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(connect(autocommit=True))
        if producer is None:
            producer = stack.enter_context(connect())
        listener.execute(f'LISTEN "{wake.WAKE_CHANNEL}"')
        with producer.transaction():
            produce(producer)
        producer.execute("SELECT pg_notify(%s, %s)", [wake.WAKE_CHANNEL, MARKER])
        producer.commit()
        got = []
        for note in listener.notifies(timeout=30):
            if note.payload == MARKER:
                return got
            got.append(note.payload)
    pytest.fail("the marker NOTIFY never arrived")


def insert_work(conn: psycopg.Connection) -> None:
    """An SQL producer's INSERT: created_at's default wakes every stored channel's workers."""
    conn.execute(INSERT_WORK, ['{"key": "w"}'])


def send_work(conn: psycopg.Connection) -> None:
    """notify()'s statement: pgmsg_send wakes its channel's workers."""
    conn.execute("SELECT pgmsg_send('test.work', '{\"key\": \"w\"}')")


def send_prepared_work(conn: psycopg.Connection) -> None:
    """notify()'s statement where it is prepared: pgmsg_send's steps written out."""
    conn.execute(
        sending.QUERIES["send_prepared"],
        {"channel": "test.work", "payload": '{"key": "w"}'},
        prepare=True,
    )


PRODUCERS = pytest.mark.parametrize(
    "produce, woken",
    [
        (insert_work, ANY_CHANNEL_WAKE),
        (send_work, "test.work"),
        (send_prepared_work, "test.work"),
    ],
    ids=["sql_insert", "pgmsg_send", "notify_prepared"],
)
#: notify()'s two statements: pgmsg_send(), and the one prepared on the connection.
SENDS = pytest.mark.parametrize("send", [send_work, send_prepared_work], ids=["call", "prepared"])


def test_a_notification_worker_is_idle_for_its_channels_and_for_any_channel():
    assert NotificationSource(["test.work"]).wake_payloads == WORKER_PAYLOADS


@PRODUCERS
def test_a_producer_commits_without_notify_when_no_worker_is_idle(produce, woken):
    assert wakes_after(produce) == []


@PRODUCERS
def test_a_producer_notifies_while_a_worker_is_declared_idle_for_its_channel(produce, woken):
    with connect(autocommit=True) as worker:
        idle = wake.IdleDeclaration(WORKER_PAYLOADS)
        assert idle.declare(worker.cursor()) is True
        assert idle.settled
        assert wakes_after(produce) == [woken]


@SENDS
def test_an_idle_worker_of_another_channel_does_not_make_a_send_notify(send):
    with connect(autocommit=True) as worker:
        wake.IdleDeclaration(["test.typed", "inbox:test.inbox"]).declare(worker.cursor())
        assert wakes_after(send) == []


def test_an_sql_insert_wakes_only_workers_of_stored_channels():
    with connect(autocommit=True) as worker:
        wake.IdleDeclaration(["test.work", "inbox:test.inbox", "events"]).declare(worker.cursor())
        assert wakes_after(insert_work) == []  # no notification worker is idle


@PRODUCERS
def test_a_withdrawn_declaration_stops_the_notifies(produce, woken):
    with connect(autocommit=True) as worker:
        idle = wake.IdleDeclaration(WORKER_PAYLOADS)
        idle.declare(worker.cursor())
        assert wakes_after(produce) == [woken]
        idle.withdraw(worker.cursor())
        assert not idle.declared
        assert wakes_after(produce) == []


def test_a_worker_whose_connection_closes_stops_counting_as_idle():
    with connect(autocommit=True) as worker:
        wake.IdleDeclaration(WORKER_PAYLOADS).declare(worker.cursor())
    assert wakes_after(insert_work) == []
    assert wakes_after(send_work) == []


def test_an_all_category_subscription_is_woken_by_any_category():
    def append(conn):
        conn.execute(
            "INSERT INTO pgmsg_event (stream_name, category, version, type, data, metadata, "
            "message_id) VALUES ('order-1', 'order', 1, 'Placed', '{}', '{}', "
            "gen_random_uuid())"
        )

    with connect(autocommit=True) as worker:
        wake.IdleDeclaration(["events"]).declare(worker.cursor())
        assert wakes_after(append) == ["events:order"]


def _pgmsg_append(conn, stream: str = "order-2") -> None:
    """One event through pgmsg_append, which wakes by itself (its INSERT skips the triggers)."""
    conn.execute(
        "SELECT pgmsg_append(%s, %s, ARRAY['Placed'], ARRAY['{}'], ARRAY['{}'], "
        "ARRAY[gen_random_uuid()])",
        [stream, stream.split("-")[0]],
    )


def test_pgmsg_append_wakes_the_category_and_the_all_category_workers_only_while_idle():
    assert wakes_after(_pgmsg_append) == []
    with connect(autocommit=True) as worker:
        wake.IdleDeclaration(["events:order"]).declare(worker.cursor())
        assert wakes_after(_pgmsg_append) == ["events:order"]
        # Two appends of the category in one transaction: one check, one NOTIFY.
        assert wakes_after(lambda conn: [_pgmsg_append(conn), _pgmsg_append(conn)]) == [
            "events:order"
        ]
        assert wakes_after(lambda conn: _pgmsg_append(conn, "invoice-1")) == []
    with connect(autocommit=True) as worker:
        wake.IdleDeclaration(["events"]).declare(worker.cursor())
        assert wakes_after(lambda conn: _pgmsg_append(conn, "invoice-1")) == ["events:invoice"]


def test_the_barrier_waits_for_a_transaction_that_called_pgmsg_append():
    with connect() as producer, connect(autocommit=True) as worker:
        _pgmsg_append(producer)
        idle = wake.IdleDeclaration(["events:order"])
        assert idle.declare(worker.cursor()) is False, "must not sleep: an append is in flight"
        producer.commit()
        assert idle.declare(worker.cursor()) is True


@PRODUCERS
def test_the_barrier_waits_for_a_producer_that_checked_before_the_declaration(produce, woken):
    with connect() as producer, connect(autocommit=True) as worker:
        produce(producer)  # its wake check ran: nobody idle, so no NOTIFY at its commit
        idle = wake.IdleDeclaration(WORKER_PAYLOADS)
        assert idle.declare(worker.cursor()) is False, "must not sleep: a producer is in flight"
        assert idle.declared and not idle.settled
        producer.commit()
        assert idle.declare(worker.cursor()) is True  # now look at the table once more
        assert idle.settled


@pytest.mark.processes
def test_a_worker_finds_a_row_whose_producer_committed_after_the_worker_went_idle(workers):
    """The race end to end: the producer's wake check runs before the worker exists (no
    NOTIFY will come), the worker goes idle, then the producer commits. With a sweep of 600 s,
    only the barrier's second look can find the row."""
    with connect() as producer:
        insert_work(producer)
        workers.start("test.work", "--settings", "pgmsg_tests.testapp.inbox_settings")
        wait_for(idle_declared, timeout=60, message="worker declared itself idle")
        assert Notification.objects.count() == 0  # not committed yet
        producer.commit()
    wait_for(lambda: effect_counts() == {"w": 1}, timeout=60, message="row handled")


@pytest.mark.processes
def test_an_idle_worker_handles_at_once_a_row_an_sql_producer_inserts(workers):
    """No trigger on the table: created_at's default wakes the idle worker (sweep 600 s)."""
    workers.start("test.work", "--settings", "pgmsg_tests.testapp.inbox_settings")
    wait_for(idle_declared, timeout=60, message="worker declared itself idle")
    assert wakes_after(insert_work) == [ANY_CHANNEL_WAKE]
    wait_for(lambda: effect_counts() == {"w": 1}, timeout=60, message="row handled")


def test_rows_a_worker_puts_back_wake_the_idle_workers_of_their_channels():
    """A failed or stopped batch's rows are inserted again with their created_at, so its
    default does not run: restore_notifications wakes their channels itself."""
    from pgmsg.channels.source import QUERIES, ClaimedNotification, _restore_params

    row = ClaimedNotification(
        id=10**9, channel="test.work", payload='{"key": "r"}', attempts=0,
        available_at="2026-01-01T00:00:00Z", created_at="2026-01-01T00:00:00Z",
        last_error="", last_failed_at=None, claimed_in=0,
    )  # fmt: skip
    restore = lambda conn: conn.execute(  # noqa: E731
        QUERIES["restore_notifications"], _restore_params([row], {})
    )
    with connect(autocommit=True) as worker:
        wake.IdleDeclaration(["test.work"]).declare(worker.cursor())
        assert wakes_after(restore) == ["test.work"]
    assert Notification.objects.filter(id=row.id, channel="test.work").exists()


@pytest.mark.processes
def test_a_worker_finds_the_rows_a_transaction_sent_without_waking_again(workers):
    """The same race with rows that skip the wake check: the first row's check ran before the
    worker existed, the worker went idle, then pgmsg_send() added a row without a check of its
    own (the channel was marked woken) and the transaction committed without NOTIFY. With a
    sweep of 600 s, only the barrier, held by the first row's lock, can find both rows."""
    with connect() as producer:
        insert_work(producer)
        workers.start("test.work", "--settings", "pgmsg_tests.testapp.inbox_settings")
        wait_for(idle_declared, timeout=60, message="worker declared itself idle")
        producer.execute("SELECT pgmsg_send('test.work', '{\"key\": \"v\"}')")
        producer.commit()
    wait_for(lambda: effect_counts() == {"w": 1, "v": 1}, timeout=60, message="rows handled")


@pytest.mark.processes
def test_a_lone_message_leaves_the_worker_declared_and_a_stream_makes_it_withdraw(workers):
    """A message found while the worker is idle is handled under its declaration: producers
    keep waking the worker, which goes back to sleep at once. Work found again within
    IDLE_AFTER (a minute here) is a stream: the worker withdraws and keeps looking, and
    producers commit without NOTIFY."""

    def send(key: str):
        return lambda conn: conn.execute(
            "SELECT pgmsg_send('test.work', %s)", [f'{{"key": "{key}"}}']
        )

    workers.start("test.work", "--settings", "pgmsg_tests.testapp.linger_settings")
    wait_for(idle_declared, timeout=60, message="worker declared itself idle")
    assert wakes_after(send("a")) == ["test.work"]
    wait_for(lambda: effect_counts() == {"a": 1}, timeout=60, message="a handled")
    assert idle_declared()
    assert wakes_after(send("b")) == ["test.work"]  # still declared: its producer wakes it
    wait_for(lambda: effect_counts() == {"a": 1, "b": 1}, timeout=60, message="b handled")
    wait_for(lambda: not idle_declared(), timeout=60, message="the worker withdrew")
    assert wakes_after(send("c")) == []  # busy: no NOTIFY, found by the worker's next look
    wait_for(lambda: effect_counts() == {"a": 1, "b": 1, "c": 1}, timeout=60, message="c")


def idle_declared() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s::oid "
            "AND objid = hashtext('test.work')::oid AND objsubid = 2 AND granted",
            [wake.IDLE_CLASS],
        )
        return cursor.fetchone()[0] > 0


def test_a_declaration_knows_when_its_connection_is_gone():
    with connect(autocommit=True) as worker:
        idle = wake.IdleDeclaration(["test.work"])
        idle.declare(worker.cursor())
        assert idle.held_by(worker)
    assert not idle.held_by(worker)


# -- one wake per channel and transaction (pgmsg_send, and created_at's default) -------------


@SENDS
def test_a_second_row_of_a_channel_in_a_transaction_does_not_wake_again(send):
    """The first row's wake check holds the producing lock until the commit, so a worker
    that declares itself idle after it cannot sleep before the commit: later rows of the
    transaction need no check of their own (the woken mark skips them)."""
    with connect() as producer, connect(autocommit=True) as worker:
        insert_work(producer)  # nobody idle: no NOTIFY at commit
        idle = wake.IdleDeclaration(WORKER_PAYLOADS)
        assert idle.declare(worker.cursor()) is False, "the first row's lock holds the barrier"
        insert_work(producer)
        send(producer)
        producer.commit()
        assert idle.declare(worker.cursor()) is True  # the worker now looks: both rows are there
    assert Notification.objects.count() == 3


@SENDS
def test_a_rolled_back_savepoint_forgets_that_its_channel_was_woken(send):
    """The mark that skips later rows is undone with the savepoint, as the lock it relies
    on is: the next row checks again, and NOTIFYs for a worker that went idle meanwhile."""
    with connect(autocommit=True) as worker:
        idle = wake.IdleDeclaration(["test.work"])

        def produce(conn):
            with conn.transaction():  # a savepoint inside the producer's transaction
                insert_work(conn)  # nobody idle yet: no NOTIFY
                send(conn)
                raise psycopg.Rollback
            assert idle.declare(worker.cursor()) is True, "the savepoint's lock went with it"
            send(conn)

        assert wakes_after(produce) == ["test.work"]


@PRODUCERS
def test_every_new_transaction_of_a_session_checks_again(produce, woken):
    with connect(autocommit=True) as worker, connect() as producer:
        assert wakes_after(produce, producer) == []
        wake.IdleDeclaration(WORKER_PAYLOADS).declare(worker.cursor())
        assert wakes_after(produce, producer) == [woken]


def test_notify_many_wakes_each_of_its_channels():
    def produce(conn):
        conn.execute(
            "SELECT pgmsg_send_many(ARRAY['test.work', 'test.typed', 'test.work'], "
            'ARRAY[\'{"key": "a"}\', \'{}\', \'{"key": "b"}\'])'
        )

    with connect(autocommit=True) as worker:
        wake.IdleDeclaration(["test.work", "test.typed"]).declare(worker.cursor())
        assert sorted(wakes_after(produce)) == ["test.typed", "test.work"]


def test_a_lingering_worker_looks_last_when_idle_after_runs_out():
    from pgmsg.core.worker import linger_pause

    # IDLE_AFTER 10 ms, pauses doubling from 1 ms: looks at 1, 3, 7, then 10 ms (not 15).
    assert linger_pause(0.0, 0.01, 0.001) == pytest.approx(0.001)
    assert linger_pause(0.003, 0.01, 0.004) == pytest.approx(0.004)
    assert linger_pause(0.007, 0.01, 0.008) == pytest.approx(0.003)
    assert linger_pause(0.0105, 0.01, 0.016) == 0.0


def test_pgmsg_send_takes_the_keys_pgmsg_wake_takes():
    """Migration 0021 writes pgmsg_wake's check into pgmsg_send, and notify()'s prepared
    statement writes it out again: the same two lock classes."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT prosrc FROM pg_proc WHERE proname IN ('pgmsg_send', 'pgmsg_wake') "
            "ORDER BY proname"
        )
        send, wake_ = (row[0] for row in cursor.fetchall())
    for key in (wake.PRODUCING_CLASS, wake.IDLE_CLASS):
        assert f"({key}, hashtext(channel_name))" in send
        assert f"({key}, hashtext(payload))" in wake_
        assert f"({key}, hashtext(%(channel)s))" in sending.QUERIES["send_prepared"]
