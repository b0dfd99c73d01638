"""The event store over monthly partitions: message ids stay idempotent whichever partition
holds the first copy, and reads, versions and the read order are unchanged across them."""

import datetime as dt
from decimal import Decimal

import pytest
from django.db import connection, transaction

import pgmsg
from pgmsg.core import errors, partitions
from pgmsg.models import StoredEvent
from pgmsg_tests.testapp.events_handlers import Deposited

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = "pgmsg_event"
SUBSCRIPTION = "test-ledger"


def _last_month() -> tuple[str, dt.datetime]:
    today = dt.datetime.now(dt.UTC)
    index = today.year * 12 + today.month - 2
    start = dt.datetime(index // 12, index % 12 + 1, 1, tzinfo=dt.UTC)
    end = dt.datetime(today.year, today.month, 1, tzinfo=dt.UTC)
    name = f"{TABLE}_p{start:%Y%m}"
    with transaction.atomic(), connection.cursor() as cursor:
        if name not in {p.name for p in partitions.partitions(cursor, TABLE)}:
            partitions.create(cursor, TABLE, name, start, end)
    return name, start


def _partition_of(stream: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT tableoid::regclass::text FROM {TABLE} WHERE stream_name = %s ORDER BY version",
            [stream],
        )
        return [row[0] for row in cursor.fetchall()]


def test_a_stored_message_id_in_an_older_partition_is_still_recognised():
    name, start = _last_month()
    first = [Deposited(amount=Decimal(1)), Deposited(amount=Decimal(2))]
    pgmsg.append("account-1", first)
    StoredEvent.objects.filter(stream_name="account-1").update(
        recorded_at=start + dt.timedelta(days=2)
    )
    assert _partition_of("account-1") == [name, name]
    retried = [Deposited(amount=Decimal(1), message_id=e.message_id) for e in first]
    assert pgmsg.append("account-1", retried) == 2
    with pytest.raises(errors.DuplicateMessageId, match="already stored in other streams"):
        pgmsg.append("account-2", Deposited(amount=Decimal(1), message_id=first[0].message_id))
    assert StoredEvent.objects.count() == 2


def test_streams_read_whole_and_in_order_across_partitions():
    name, start = _last_month()
    pgmsg.append("account-3", [Deposited(amount=Decimal(i)) for i in range(3)])
    StoredEvent.objects.filter(stream_name="account-3").update(
        recorded_at=start + dt.timedelta(days=2)
    )
    assert pgmsg.append("account-3", Deposited(amount=Decimal(9)), expected_version=3) == 4
    assert _partition_of("account-3") == [
        name,
        name,
        name,
        f"{TABLE}_p{dt.datetime.now(dt.UTC):%Y%m}",
    ]
    with pytest.raises(errors.ConcurrencyError):
        pgmsg.append("account-3", Deposited(amount=Decimal(1)), expected_version=3)
    assert [e.version for e in pgmsg.read_stream("account-3")] == [1, 2, 3, 4]
    assert [e.version for e in pgmsg.read_all() if e.stream_name == "account-3"] == [1, 2, 3, 4]


def _drop_future_months() -> list[str]:
    this_month = partitions.month_start(dt.datetime.now(dt.UTC))
    with transaction.atomic(), connection.cursor() as cursor:
        future = [
            p.name
            for p in partitions.partitions(cursor, TABLE)
            if not p.is_default and p.lower_time() > this_month
        ]
        for name in future:
            partitions.drop(cursor, name)
    return future


def test_a_subscription_worker_makes_the_months_ahead_itself():
    from pgmsg.core.worker import Worker
    from pgmsg.events import partitions as event_partitions

    dropped = _drop_future_months()
    assert len(dropped) == event_partitions.MONTHS_AHEAD
    pgmsg.append("account-5", Deposited(amount=Decimal(1)))
    Worker(subscriptions=[SUBSCRIPTION], until_idle=True, install_signal_handlers=False).run()
    with connection.cursor() as cursor:
        names = {p.name for p in partitions.partitions(cursor, TABLE)}
    assert set(dropped) <= names


def test_maintenance_analyzes_a_month_that_holds_events_but_was_never_analyzed():
    from pgmsg.events import partitions as event_partitions

    today = dt.datetime.now(dt.UTC)
    start = dt.datetime(today.year - 3, today.month, 1, tzinfo=dt.UTC)
    end = dt.datetime(today.year - 3 + (today.month == 12), today.month % 12 + 1, 1, tzinfo=dt.UTC)
    name = f"{TABLE}_p{start:%Y%m}"
    with transaction.atomic(), connection.cursor() as cursor:
        partitions.create(cursor, TABLE, name, start, end)
    try:
        pgmsg.append("account-9", [Deposited(amount=Decimal(i)) for i in range(3)])
        StoredEvent.objects.filter(stream_name="account-9").update(
            recorded_at=start + dt.timedelta(days=1)
        )
        assert _partition_of("account-9") == [name] * 3
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
        connection.close()  # a session's table counts reach the shared statistics at its end

        assert name in event_partitions.analyze_new_months()

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = %s",
                [name],
            )
            assert cursor.fetchone() == (True,)
        assert name not in event_partitions.analyze_new_months()
    finally:
        StoredEvent.objects.filter(stream_name="account-9").delete()
        with transaction.atomic(), connection.cursor() as cursor:
            partitions.drop(cursor, name)


def _insert_events(ids: list[str], stream: str = "account-20") -> None:
    """Rows inserted in SQL, as a producer that is not Django would (one statement)."""
    values = ", ".join(
        f"('{stream}', 'account', {n + 1}, 't', '{{}}', '{{}}', '{i}')" for n, i in enumerate(ids)
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgmsg_event (stream_name, category, version, type, data, metadata, "
            f"message_id) VALUES {values}"
        )


def test_the_key_trigger_refuses_a_stored_id_and_an_id_twice_in_one_statement():
    from django.db import IntegrityError

    from pgmsg.core.ids import uuid7

    stored = Deposited(amount=Decimal(1))
    pgmsg.append("account-20", stored)
    fresh = [str(uuid7()), str(uuid7())]
    with pytest.raises(IntegrityError, match=f"message id {stored.message_id} is stored already"):
        _insert_events([fresh[0], str(stored.message_id)], stream="account-21")
    with pytest.raises(IntegrityError, match=f"message id {fresh[1]} is stored already"):
        _insert_events([fresh[1], fresh[1]], stream="account-22")
    assert StoredEvent.objects.count() == 1  # the failed statements wrote nothing
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pgmsg_event_key WHERE message_id::text = ANY(%s)", [fresh]
        )
        assert cursor.fetchone()[0] == 0

    # A key whose event is gone (its month dropped) lets the id in again.
    StoredEvent.objects.all().delete()
    _insert_events([str(stored.message_id)], stream="account-23")
    assert list(StoredEvent.objects.values_list("stream_name", flat=True)) == ["account-23"]


def _sql_append(cursor, stream: str, ids: list) -> int | None:
    cursor.execute(
        "SELECT pgmsg_append(%s, %s, %s::text[], %s::text[], %s::text[], %s::uuid[])",
        [stream, "account", ["t"] * len(ids), ["{}"] * len(ids), ["{}"] * len(ids), ids],
    )
    return cursor.fetchone()[0]


def test_pgmsg_append_refuses_what_the_key_trigger_refuses_and_leaves_it_armed():
    """pgmsg_append writes the keys itself (its INSERT skips the triggers): the same refusals,
    and an INSERT after it in the same transaction still meets the key trigger."""
    from django.db import IntegrityError

    from pgmsg.core.ids import uuid7

    stored = Deposited(amount=Decimal(1))
    pgmsg.append("account-30", stored)
    fresh = [str(uuid7()) for _ in range(4)]
    for stream, ids in (
        ("account-31", [fresh[0], str(stored.message_id)]),
        ("account-32", [fresh[1], fresh[1]]),
    ):
        with pytest.raises(IntegrityError, match="is stored already"):
            with transaction.atomic(), connection.cursor() as cursor:
                _sql_append(cursor, stream, ids)
    assert StoredEvent.objects.count() == 1
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pgmsg_event_key WHERE message_id::text = ANY(%s)", [fresh]
        )
        assert cursor.fetchone()[0] == 0

    # In one transaction: an append, then a plain INSERT of the appended id (refused by the
    # trigger, so the mark did not outlive the append), then one of a fresh id (keyed).
    with transaction.atomic(), connection.cursor() as cursor:
        assert _sql_append(cursor, "account-33", [fresh[2]]) == 1
        with pytest.raises(IntegrityError, match=f"message id {fresh[2]} is stored already"):
            with transaction.atomic():
                _insert_events([fresh[2]], stream="account-34")
        _insert_events([fresh[3]], stream="account-35")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT message_id::text FROM pgmsg_event_key WHERE message_id::text = ANY(%s)",
            [fresh],
        )
        assert sorted(row[0] for row in cursor.fetchall()) == sorted(fresh[2:])

    # A key whose event is gone lets the id in again through pgmsg_append too.
    StoredEvent.objects.filter(stream_name="account-30").delete()
    with connection.cursor() as cursor:
        assert _sql_append(cursor, "account-36", [str(stored.message_id)]) == 1
    assert StoredEvent.objects.filter(message_id=stored.message_id).count() == 1
