"""notify() in the caller's transaction; delivery to listeners by an in-process worker."""

import datetime as dt
import uuid
from decimal import Decimal

import psycopg
import pytest
from django.db import InternalError, connection, transaction
from django.db.backends.utils import CursorWrapper
from django.db.transaction import TransactionManagementError
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import pgmsg
from pgmsg.core import errors
from pgmsg.models import Notification
from pgmsg_tests.helpers import drain, effect_counts, refused_in_another_thread
from pgmsg_tests.testapp.channels import Colour, Shout, Typed, Unheard, Work
from pgmsg_tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def test_committed_messages_are_delivered_once_to_every_listener():
    with transaction.atomic():
        for i in range(5):
            pgmsg.notify(Work(key=f"k{i}"))
    drain()
    assert effect_counts() == {f"k{i}": 1 for i in range(5)}
    assert effect_counts(listener="second_listener") == {f"k{i}": 1 for i in range(5)}
    assert Notification.objects.count() == 0


def test_a_rolled_back_notify_is_never_delivered():
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        pgmsg.notify(Work(key="ghost"))
        raise Boom
    pgmsg.notify(Work(key="real"))
    drain()
    assert effect_counts() == {"real": 1}
    assert Notification.objects.count() == 0


def test_notify_many_stores_all_in_one_statement():
    assert pgmsg.notify_many(Work(key=f"m{i}") for i in range(250)) == 250
    drain(batch_size=40)
    assert effect_counts() == {f"m{i}": 1 for i in range(250)}


def test_payloads_far_above_8000_bytes_work_on_exactly_once_channels():
    big = "x" * 100_000
    pgmsg.notify(Work(key=big))
    drain()
    assert effect_counts() == {big: 1}


def test_typed_fields_reach_the_listener_as_their_types():
    ident = uuid.uuid4()
    pgmsg.notify(
        Typed(
            when=dt.datetime(2026, 5, 6, 7, 8, 9, tzinfo=dt.UTC),
            day=dt.date(2026, 5, 6),
            amount=Decimal("0.10"),
            ident=ident,
            colour=Colour.RED,
            tags=["t"],
            extra={"a": 2},
        )
    )
    drain()
    data = Effect.objects.get(channel="test.typed").data
    assert data["types"] == ["datetime", "Decimal", "UUID", "Colour"]
    assert data["when"] == "2026-05-06T07:08:09+00:00"
    assert data["amount"] == "0.10"
    assert data["extra"] == {"a": 2}


def test_rows_of_channels_without_listeners_are_left_alone():
    pgmsg.notify(Unheard(key="nobody"))
    pgmsg.notify(Work(key="somebody"))
    drain()
    assert list(Notification.objects.values_list("channel", flat=True)) == ["test.unheard"]


def test_worker_serves_only_the_channels_named():
    pgmsg.notify(Work(key="w"))
    pgmsg.notify(
        Typed(
            when=dt.datetime.now(dt.UTC),
            day=dt.date.today(),
            amount=Decimal(1),
            ident=uuid.uuid4(),
            colour=Colour.RED,
            tags=[],
            extra={},
        )
    )
    drain("test.typed")
    assert Effect.objects.filter(channel="test.typed").count() == 1
    assert list(Notification.objects.values_list("channel", flat=True)) == ["test.work"]


def test_unknown_or_unlistened_channel_names_are_refused_by_the_worker():
    with pytest.raises(errors.UnknownChannel, match="no channel named 'nope'"):
        drain("nope")
    with pytest.raises(errors.ConfigurationError, match="has no listener"):
        drain("test.unheard")


def test_a_broadcast_above_the_notify_limit_is_refused_and_nothing_is_sent():
    with pytest.raises(errors.PayloadTooLarge, match="at most 7999"):
        pgmsg.notify(Shout(text="y" * 8000))


def test_a_broadcast_is_a_plain_notify_at_commit():
    with connection.cursor() as cursor:
        cursor.execute('LISTEN "pgmsg:test.shout"')
    # The test connection listened; the notification comes with the COMMIT's answer, which
    # psycopg 3.2.0 (setup.cfg's lower bound) hands to notify handlers only, not to a later
    # notifies().
    notifies = []
    handler = notifies.append
    connection.connection.add_notify_handler(handler)
    try:
        with transaction.atomic():
            assert pgmsg.notify(Shout(text="hello")) is None
    finally:
        connection.connection.remove_notify_handler(handler)
    assert [(n.channel, n.payload) for n in notifies] == [("pgmsg:test.shout", '{"text":"hello"}')]
    with connection.cursor() as cursor:
        cursor.execute("UNLISTEN *")


def test_sql_producers_can_insert_rows_directly():
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgmsg_notification (channel, payload) VALUES (%s, %s::jsonb)",
            ["test.work", '{"key": "from-sql"}'],
        )
    drain()
    assert effect_counts() == {"from-sql": 1}


# -- notify() goes straight to psycopg's cursor, in Django's session and transaction ---------


def test_an_execute_wrapper_sees_notify():
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        pgmsg.notify(Work(key="w"))
    assert any("pgmsg_send" in sql for sql in seen)


@pytest.mark.parametrize("through_django", [True, False])
def test_instrumentation_patching_djangos_cursor_sees_notify_when_asked(
    monkeypatch, through_django
):
    seen = []
    execute = CursorWrapper.execute

    def patched(self, sql, params=None):
        seen.append(sql)
        return execute(self, sql, params)

    monkeypatch.setattr(CursorWrapper, "execute", patched)
    with override_settings(PGMSG={"SEND_THROUGH_DJANGO_CURSOR": through_django}):
        pgmsg.notify(Work(key="w"))
    assert any("pgmsg_send" in sql for sql in seen) is through_django
    assert Notification.objects.count() == 1


def test_notify_in_an_atomic_block_marked_for_rollback_raises_djangos_error():
    class Boom(Exception):
        pass

    with transaction.atomic():
        with pytest.raises(Boom), transaction.atomic(savepoint=False):
            raise Boom
        with pytest.raises(TransactionManagementError):
            pgmsg.notify(Work(key="w"))
    assert Notification.objects.count() == 0


def test_a_database_error_from_notify_is_djangos():
    with transaction.atomic():
        with pytest.raises(psycopg.errors.DivisionByZero):
            connection.connection.execute("SELECT 1/0")  # behind Django's back
        with pytest.raises(InternalError):  # "current transaction is aborted"
            pgmsg.notify(Work(key="w"))
        transaction.set_rollback(True)
    pgmsg.notify(Work(key="after"))
    assert list(Notification.objects.values_list("payload__key", flat=True)) == ["after"]


def test_notify_follows_a_new_connection():
    pgmsg.notify(Work(key="a"))
    connection.close()
    pgmsg.notify(Work(key="b"))
    with transaction.atomic():
        pgmsg.notify(Work(key="c"))
        transaction.on_commit(lambda: pgmsg.notify(Work(key="d")))
    drain()
    assert effect_counts() == {"a": 1, "b": 1, "c": 1, "d": 1}


def test_after_its_first_send_notify_still_notices_what_changes_between_calls():
    """notify() checks less once a connection has taken its libpq path (sends._kept_value); it
    must still notice everything that can change from one call to the next. Each step first
    sends once more, so that it starts on that shorter path (PGMSG overridden leaves it)."""
    sent = []

    def send(key: str) -> None:
        pgmsg.notify(Work(key=key))
        sent.append(key)

    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    send("first")
    send("hot")
    with connection.execute_wrapper(wrapper):
        send("wrapped")
    assert any("pgmsg_send" in sql for sql in seen)
    send("warm")
    with CaptureQueriesContext(connection) as captured:
        send("captured")
    assert any("pgmsg_send" in q["sql"] for q in captured.captured_queries)
    send("warm")
    with override_settings(DEBUG=True):
        connection.queries_log.clear()
        send("debug")
        assert any("pgmsg_send" in q["sql"] for q in connection.queries)
    send("warm")
    with transaction.atomic():
        pgmsg.notify(Work(key="rolled back"))  # the transaction under way on the server
        with pytest.raises(RuntimeError), transaction.atomic(savepoint=False):
            raise RuntimeError
        with pytest.raises(TransactionManagementError):
            pgmsg.notify(Work(key="broken block"))
    send("warm")
    # Django's connections are per thread; one handed to another thread (as a careless
    # caller could) must still be refused there.
    refused = refused_in_another_thread(lambda: pgmsg.notify(Work(key="other thread")))
    assert refused and "thread" in str(refused[0])
    send("warm")
    connection.close()
    send("new connection")
    send("warm")
    connection.connection.execute("DEALLOCATE ALL")  # behind pgmsg's back, in autocommit
    send("prepared anew")
    keys = Notification.objects.values_list("payload__key", flat=True)
    assert sorted(keys) == sorted(sent)


def prepared_sends() -> list[str]:
    """The names of notify()'s statements prepared in this session (by pgmsg: one_value names
    them pgmsg_<hash>)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name FROM pg_prepared_statements "
            "WHERE statement LIKE '%INSERT INTO pgmsg_notification%'"
        )
        return [row[0] for row in cursor.fetchall()]


def reconnect() -> None:
    connection.close()
    connection.ensure_connection()


@pytest.mark.wire_fast_path
def test_notify_is_prepared_once_per_connection_and_kept_across_a_rollback():
    for _ in range(3):
        pgmsg.notify(Work(key="w"))
    names = prepared_sends()
    assert len(names) == 1 and names[0].startswith("pgmsg_"), names
    # A transaction that rolls back keeps the statement (the server keeps it to the session's
    # end), and the next send runs it by name.
    with pytest.raises(RuntimeError), transaction.atomic():
        pgmsg.notify(Work(key="w"))
        pgmsg.notify(Work(key="rolled back"))
        raise RuntimeError
    with transaction.atomic():
        pgmsg.notify(Work(key="w"))
        pgmsg.notify(Work(key="kept"))
    assert prepared_sends() == names
    keys = Notification.objects.values_list("payload__key", flat=True)
    assert sorted(set(keys)) == ["kept", "w"] and len(keys) == 5
    # A new connection has no statement of the old one's: it prepares its own.
    reconnect()
    pgmsg.notify(Work(key="new connection"))
    assert prepared_sends() == names
    assert Notification.objects.filter(payload__key="new connection").count() == 1


@pytest.mark.parametrize(
    "pgmsg_setting, database_settings, prepares",
    [
        (None, {"DISABLE_SERVER_SIDE_CURSORS": True}, False),
        (None, {"OPTIONS": {"prepare_threshold": None}}, False),
        (None, {"OPTIONS": {"prepare_threshold": 5}}, True),
        (False, {}, False),
        (True, {"DISABLE_SERVER_SIDE_CURSORS": True}, True),
    ],
    ids=["pooler_cursors_off", "psycopg_prepares_off", "psycopg_prepares", "off", "forced"],
)
def test_notify_is_not_prepared_where_a_transaction_pooler_may_sit(
    monkeypatch, pgmsg_setting, database_settings, prepares
):
    """Django's DISABLE_SERVER_SIDE_CURSORS (its setting for transaction-mode poolers) and
    OPTIONS that turn psycopg's preparing off keep notify() unprepared; the PGMSG setting
    decides where it is set."""
    for key, value in database_settings.items():
        monkeypatch.setitem(connection.settings_dict, key, value)
    with override_settings(PGMSG={"PREPARE_STATEMENTS": pgmsg_setting}):
        reconnect()
        for n in range(3):
            pgmsg.notify(Work(key=f"k{n}"))
        assert len(prepared_sends()) == (1 if prepares else 0)
    reconnect()
    drain()
    assert effect_counts() == {"k0": 1, "k1": 1, "k2": 1}


@pytest.fixture
def stopped_preparing():
    """The record of the databases this process stopped preparing on, emptied after the
    test."""
    from pgmsg.core.wire import prepared

    yield prepared._stopped
    prepared._stopped.clear()


@pytest.mark.wire_fast_path
def test_a_statement_deallocated_behind_pgmsgs_back_is_prepared_anew_or_the_error_says_why(
    stopped_preparing, caplog
):
    """Where the session lost the statement (DEALLOCATE ALL here; a transaction-mode pooler
    that moved the connection to another server session, or a pool that resets sessions, in
    production), notify() in autocommit prepares it again and sends (nothing had run). Inside
    a transaction the transaction is aborted: the error names the settings, the transaction's
    messages are gone with it, and the process stops preparing on that database (logged), so
    that the next transactions go through."""
    pgmsg.notify(Work(key="before"))
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    pgmsg.notify(Work(key="autocommit"))
    assert len(prepared_sends()) == 1 and not stopped_preparing
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    with pytest.raises(Exception) as raised, transaction.atomic():
        Effect.objects.create(key="in the transaction", listener="test")
        pgmsg.notify(Work(key="lost with its transaction"))
    cause = raised.value.__cause__ or raised.value
    assert isinstance(cause, psycopg.errors.InvalidSqlStatementName)
    assert any("PREPARE_STATEMENTS" in note for note in cause.__notes__)
    assert not Effect.objects.filter(key="in the transaction").exists()
    assert stopped_preparing == {"default"}
    assert "stops preparing" in caplog.text
    for n in range(2):
        with transaction.atomic():
            pgmsg.notify(Work(key=f"next transaction {n}"))
    assert prepared_sends() == []
    drain()
    assert effect_counts() == {
        "before": 1,
        "autocommit": 1,
        "next transaction 0": 1,
        "next transaction 1": 1,
    }


@pytest.mark.wire_fast_path
def test_a_statement_the_session_already_has_is_run_by_name():
    """A session that has pgmsg's statement though this connection never prepared it (another
    client's, behind a pooler): the name is its text's hash, so it is the same statement."""
    from pgmsg.core.wire import prepared

    pgmsg.notify(Work(key="a"))
    prepared.forget(connection.connection)  # forgotten here, still in the session
    pgmsg.notify(Work(key="b"))
    assert len(prepared_sends()) == 1
    drain()
    assert effect_counts() == {"a": 1, "b": 1}


# -- notify() through libpq when psycopg would send nothing before it (wire protocol.one_value)


@pytest.fixture
def direct_sends(monkeypatch):
    """The sends that took the libpq path (the real functions, counted): the full path's
    one_value, and the shorter one a connection takes once it has been through it."""
    from pgmsg.core.wire import protocol, sends

    calls = []
    real, real_hot = protocol.one_value, sends._kept_value

    def counted(conn, statement, values, **options):
        calls.append(values[0])  # the channel
        return real(conn, statement, values, **options)

    def counted_hot(db, hot, statement, params):
        value = real_hot(db, hot, statement, params)
        if value is not sends.NOT_SENT:
            calls.append(params["channel"])
        return value

    monkeypatch.setattr(protocol, "one_value", counted)
    monkeypatch.setattr(sends, "_kept_value", counted_hot)
    return calls


@pytest.mark.wire_fast_path
def test_notify_in_autocommit_goes_through_libpq_and_returns_the_stored_id(direct_sends):
    sent = pgmsg.notify(Work(key="a"))
    assert direct_sends == ["test.work"]
    assert list(Notification.objects.values_list("id", "payload__key")) == [(sent, "a")]


@pytest.mark.wire_fast_path
def test_notify_after_the_first_statement_of_a_transaction_goes_through_libpq_and_rolls_back(
    direct_sends,
):
    """The first statement of an atomic block needs psycopg's BEGIN (the cursor); later ones
    run in the transaction that BEGIN opened, and go with it when it rolls back."""
    with transaction.atomic():
        pgmsg.notify(Work(key="first"))
        pgmsg.notify(Work(key="second"))
        assert direct_sends == ["test.work"]
        transaction.set_rollback(True)
    assert Notification.objects.count() == 0
    with transaction.atomic():
        pgmsg.notify(Work(key="first"))
        pgmsg.notify(Work(key="second"))
    drain()
    assert effect_counts() == {"first": 1, "second": 1}


@pytest.mark.wire_fast_path
def test_a_database_error_on_the_libpq_path_is_djangos_and_leaves_the_connection_usable(
    direct_sends,
):
    with connection.cursor() as cursor:
        cursor.execute("SET default_transaction_read_only = on")
    try:
        with pytest.raises(InternalError, match="read-only transaction"):
            pgmsg.notify(Work(key="refused"))
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET default_transaction_read_only")
    assert direct_sends == ["test.work"]
    pgmsg.notify(Work(key="after"))
    assert list(Notification.objects.values_list("payload__key", flat=True)) == ["after"]
