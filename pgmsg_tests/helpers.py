"""Small helpers shared by test modules."""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator

from django.db import DatabaseError, connection, connections, transaction

from pgmsg.core.worker import Worker
from pgmsg.models import Notification, NotificationDeadLetter
from pgmsg_tests.testapp.models import Effect


def drain(*channel_names: str, batch_size: int | None = None) -> Worker:
    """Run an in-process worker until nothing is due, and return it."""
    worker = Worker(
        channel_names=channel_names or None,
        until_idle=True,
        install_signal_handlers=False,
        batch_size=batch_size,
    )
    worker.run()
    return worker


def make_dead(ids, **fields) -> None:
    """Move stored notifications to the dead letters with their ids, as a worker does when they
    give up, after setting ``fields`` (Notification's) on them."""
    ids = list(ids)
    if fields:
        Notification.objects.filter(pk__in=ids).update(**fields)
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH d AS (DELETE FROM pgmsg_notification WHERE id = ANY(%s) RETURNING *) "
            "INSERT INTO pgmsg_notification_dead "
            "(id, channel, payload, attempts, created_at, last_error, last_failed_at) "
            "SELECT id, channel, payload, attempts, created_at, last_error, last_failed_at FROM d",
            [ids],
        )


def dead_letter(**fields) -> NotificationDeadLetter:
    """A dead notification as a worker leaves one: stored (its id from the notifications'
    sequence), then moved to the dead letters. ``fields``: Notification's."""
    row = Notification.objects.create(**{"attempts": 5, **fields})
    make_dead([row.pk])
    return NotificationDeadLetter.objects.get(pk=row.pk)


def effect_counts(channel: str = "test.work", listener: str = "record_work") -> Counter:
    return Counter(
        Effect.objects.filter(channel=channel, listener=listener).values_list("key", flat=True)
    )


def make_due_now() -> None:
    """Skip retry backoff: make every pending row due (tests must not wait out delays)."""
    from django.db.models.functions import Now

    Notification.objects.update(available_at=Now())


def locked_rows() -> int:
    """Stored notifications in the batches of worker transactions still open, read from the
    workers' crash records (pgmsg/core/claims.py). Looking takes no row lock: a probe that
    locked rows (FOR UPDATE SKIP LOCKED) would make a worker's claim skip them."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(cardinality(ids)), 0) FROM pgmsg_claim "
            "WHERE kind = 'notification' "
            "AND pg_xact_status(transaction_id::text::xid8) = 'in progress'"
        )
        return cursor.fetchone()[0]


def ended_transaction_id(*, commit: bool) -> int:
    """The id of a transaction of another session, committed or rolled back as asked (a
    claim record naming it is of a batch that committed, or of one that died)."""
    import psycopg

    from pgmsg_dev.devdb import database_url

    with psycopg.connect(database_url(connection.settings_dict)) as conn:
        xid = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]
        conn.commit() if commit else conn.rollback()
    return xid


def record_claim(kind: str, ids: list[int], xid: int) -> None:
    """A claim record as a worker's would be (pid 1: no worker of this test)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgmsg_claim (kind, ids, transaction_id, pid, alone) "
            "VALUES (%s, %s, %s, 1, %s)",
            [kind, ids, xid, len(ids) == 1],
        )


def claims_on_record() -> list[tuple[str, list[int], str]]:
    """Every claim record: its kind, ids and its batch transaction's status, oldest first."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT kind, ids, pg_xact_status(transaction_id::text::xid8) FROM pgmsg_claim "
            "ORDER BY id"
        )
        return cursor.fetchall()


def refused_in_another_thread(call: Callable[[], object]) -> list[DatabaseError]:
    """Run ``call`` in another thread, handed this thread's default connection (as a careless
    caller could: Django's connections are per thread); the errors it raised there."""
    own, refused = connections["default"], []

    def in_another_thread():
        connections["default"] = own
        try:
            call()
        except DatabaseError as exc:
            refused.append(exc)

    thread = threading.Thread(target=in_another_thread)
    thread.start()
    thread.join()
    return refused


def opposite_orders(write: Callable[[str], None], name: str) -> list:
    """Two transactions, each in a thread of its own, of distinct ids (``name``: the inbox or
    outbox): one writes A1, the other B1, both wait at a barrier, then the first writes B2 and
    the second A2, where A1 and A2 (B1 and B2) shared one of the 1,024 buckets the
    first-receipt and first-publish locks took, in insertion order, before migration 0033:
    each then waited for the other, and PostgreSQL failed one with "deadlock detected".
    Returns the errors."""
    (a1, a2), (b1, b2) = colliding_ids(name)
    barrier = threading.Barrier(2, timeout=60)
    errors: list = []

    def run(first: str, then: str) -> None:
        try:
            with transaction.atomic():
                write(first)
                barrier.wait()
                write(then)
        except Exception as exc:  # noqa: BLE001 - the test reports what went wrong
            errors.append(exc)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=run, args=(a1, b2)),
        threading.Thread(target=run, args=(b1, a2)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors


def colliding_ids(name: str) -> list[tuple[str, str]]:
    """Two pairs of distinct ids, each pair in one bucket of the old lock
    (``hashtext(name || ':' || id) & 1023``), the two buckets apart."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT array_agg(id ORDER BY n) FROM (SELECT n, 'id-' || n AS id, "
            "hashtext(%s || ':id-' || n) & 1023 AS bucket FROM generate_series(1, 5000) AS n) "
            "AS c GROUP BY bucket HAVING count(*) >= 2 ORDER BY min(n) LIMIT 2",
            [name],
        )
        return [(ids[0], ids[1]) for (ids,) in cursor.fetchall()]


def waiting_for_a_lock() -> bool:
    """Whether a session of this database waits for a lock (a transaction's, a row's)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT FROM pg_locks WHERE NOT granted "
            "AND pid <> pg_backend_pid() AND pid IN (SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database()))"
        )
        return cursor.fetchone()[0]


@contextlib.contextmanager
def refused_by_the_server(table: str, column: str, value: str) -> Iterator[str]:
    """A check on ``table`` that fails with a division by zero (psycopg's DivisionByZero,
    django.db's DataError) for a row whose ``column`` is ``value``; dropped afterwards. The
    names are the test's own literals."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT pgmsg_test_refused "
            f"CHECK (1 / (CASE WHEN {column} = %s THEN 0 ELSE 1 END) = 1)",
            [value],
        )
    try:
        yield value
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} DROP CONSTRAINT pgmsg_test_refused")
