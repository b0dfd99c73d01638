"""append / read_stream / read_all: versions, expected versions, idempotency, validation.

read_all() returns events once every older transaction *in the cluster* has ended; other
sessions on the shared test server may delay that, so tests wait for what must appear.
"""

import uuid
from decimal import Decimal

import pytest
from django.db import connection, transaction

import pgmsg
from pgmsg.core import errors
from pgmsg.events import reads
from pgmsg.events import store as events
from pgmsg.models import StoredEvent, Stream
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.helpers import refused_by_the_server, refused_in_another_thread
from pgmsg_tests.testapp.events_handlers import Deposited, Opened, Step, Withdrawn

pytestmark = pytest.mark.django_db(transaction=True)


def test_append_gives_versions_and_positions_and_reads_back_typed_events():
    assert pgmsg.append("account-1", Opened(owner="ann")) == 1
    assert (
        pgmsg.append(
            "account-1", [Deposited(amount=Decimal("10.50")), Withdrawn(amount=Decimal("0.50"))]
        )
        == 3
    )
    read = pgmsg.read_stream("account-1")
    assert [r.version for r in read] == [1, 2, 3]
    assert read[0].position < read[1].position < read[2].position
    assert [r.event for r in read] == [
        Opened(owner="ann"),
        Deposited(amount=Decimal("10.50")),
        Withdrawn(amount=Decimal("0.50")),
    ]
    assert type(read[1].event.amount) is Decimal
    assert [r.type for r in read] == ["test.opened", "test.deposited", "test.withdrawn"]
    assert read[0].category == "account"
    assert read[0].data == {"owner": "ann"}  # message id and metadata stay out of the data
    row = StoredEvent.objects.get(position=read[0].position)
    assert (row.category, row.version, row.message_id) == ("account", 1, read[0].message_id)
    assert Stream.objects.get(name="account-1").version == 3


def test_read_stream_backwards_from_a_version_with_a_limit():
    pgmsg.append("seq-1", [Step(n=i) for i in range(1, 8)])
    assert [r.event.n for r in pgmsg.read_stream("seq-1", start=3, limit=2)] == [3, 4]
    assert [r.version for r in pgmsg.read_stream("seq-1", backwards=True, limit=3)] == [7, 6, 5]
    assert [r.version for r in pgmsg.read_stream("seq-1", start=2, backwards=True)] == [2, 1]
    assert pgmsg.read_stream("seq-404") == []


def test_expected_version_exact_no_stream_and_any():
    assert pgmsg.append("account-2", Opened(owner="bo"), expected_version=pgmsg.NO_STREAM) == 1
    with pytest.raises(errors.ConcurrencyError) as caught:
        pgmsg.append("account-2", Opened(owner="bo"), expected_version=pgmsg.NO_STREAM)
    assert (caught.value.stream, caught.value.actual) == ("account-2", 1)
    assert "stream 'account-2' is at version 1, but the append expected pgmsg.NO_STREAM" in str(
        caught.value
    )
    assert pgmsg.append("account-2", Deposited(amount=Decimal(1)), expected_version=1) == 2
    with pytest.raises(errors.ConcurrencyError, match="at version 2, but the append expected 1"):
        pgmsg.append("account-2", Deposited(amount=Decimal(1)), expected_version=1)
    assert pgmsg.append("account-2", Deposited(amount=Decimal(1)), expected_version=pgmsg.ANY) == 3
    assert pgmsg.append("account-3", Deposited(amount=Decimal(1)), expected_version=0) == 1
    with pytest.raises(
        errors.ConcurrencyError, match="'account-13' is at version 0, but the append expected 4"
    ):
        pgmsg.append("account-13", Deposited(amount=Decimal(1)), expected_version=4)
    assert not Stream.objects.filter(name="account-13").exists()


def test_a_version_mismatch_writes_nothing_even_inside_an_outer_transaction():
    pgmsg.append("account-4", Opened(owner="cy"))
    with transaction.atomic():
        pgmsg.append("account-5", Opened(owner="di"))
        with pytest.raises(errors.ConcurrencyError):
            pgmsg.append("account-4", [Deposited(amount=Decimal(1))] * 1, expected_version=5)
        # The outer transaction is still usable and keeps its own append.
    assert reads.stream_version("account-4") == 1
    assert reads.stream_version("account-5") == 1
    assert StoredEvent.objects.count() == 2


def test_appends_to_several_streams_commit_or_roll_back_together():
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        pgmsg.append("account-6", Opened(owner="ed"))
        pgmsg.append("account-7", Opened(owner="fay"))
        raise Boom
    assert StoredEvent.objects.count() == 0
    assert Stream.objects.count() == 0
    with transaction.atomic():
        pgmsg.append("account-6", Opened(owner="ed"))
        pgmsg.append("account-7", Opened(owner="fay"))
    assert sorted(StoredEvent.objects.values_list("stream_name", flat=True)) == [
        "account-6",
        "account-7",
    ]


def test_re_appending_stored_message_ids_is_a_no_op_that_returns_the_stored_version():
    first = [Deposited(amount=Decimal(1)), Deposited(amount=Decimal(2))]
    assert pgmsg.append("account-8", first, expected_version=pgmsg.NO_STREAM) == 2
    pgmsg.append("account-8", Deposited(amount=Decimal(3)))
    retried = [
        Deposited(amount=Decimal(1), message_id=first[0].message_id),
        Deposited(amount=Decimal(2), message_id=first[1].message_id),
    ]
    # A retried command: same ids, stale expected version; nothing new, no error.
    assert pgmsg.append("account-8", retried, expected_version=pgmsg.NO_STREAM) == 2
    assert StoredEvent.objects.filter(stream_name="account-8").count() == 3


def test_partly_stored_or_foreign_message_ids_are_refused():
    stored = Deposited(amount=Decimal(1))
    pgmsg.append("account-9", stored)
    fresh = Deposited(amount=Decimal(2))
    with pytest.raises(errors.DuplicateMessageId, match="some message ids are stored already"):
        pgmsg.append(
            "account-9", [Deposited(amount=Decimal(1), message_id=stored.message_id), fresh]
        )
    with pytest.raises(errors.DuplicateMessageId, match="already stored in other streams"):
        pgmsg.append("account-10", Deposited(amount=Decimal(1), message_id=stored.message_id))
    twice = uuid.uuid4()
    with pytest.raises(errors.DuplicateMessageId, match="appears twice"):
        pgmsg.append("account-11", [Step(n=1, message_id=twice), Step(n=2, message_id=twice)])
    assert StoredEvent.objects.count() == 1


@pytest.mark.parametrize(
    "name",
    [
        "account",
        "-1",
        "Account-1",
        "acc ount-1",
        "account-",
        "account-1 2",
        "account-1;drop",
        "a" * 58 + "-1",
        "account-" + "x" * 200,
        None,
        12,
    ],
)
def test_invalid_stream_names_are_refused_quoting_the_name(name):
    with pytest.raises(errors.InvalidStreamName) as caught:
        pgmsg.append(name, Step(n=1))
    assert repr(name)[:40] in str(caught.value)


def test_bad_appends_are_refused_with_the_reason():
    with pytest.raises(errors.PayloadError, match="not an instance of a pgmsg.Event subclass"):
        pgmsg.append("seq-1", {"n": 1})
    with pytest.raises(errors.PayloadError, match="no events given"):
        pgmsg.append("seq-1", [])
    with pytest.raises(errors.PayloadError, match="expected_version must be"):
        pgmsg.append("seq-1", Step(n=1), expected_version=-1)
    with pytest.raises(errors.PayloadError, match="message_id .* is not a UUID"):
        pgmsg.append("seq-1", Step(n=1, message_id="nope"))
    with pytest.raises(errors.PayloadError, match="cannot encode"):
        pgmsg.append("seq-1", Step(n=1, metadata={"x": object()}))
    assert StoredEvent.objects.count() == 0


def test_event_types_must_be_valid_and_unique():
    with pytest.raises(errors.ConfigurationError, match="invalid event type 'bad type'"):

        class Bad(pgmsg.Event, type="bad type"):
            x: int

    with pytest.raises(errors.ConfigurationError, match="'test.step' is declared twice"):

        class Step(pgmsg.Event, type="test.step"):
            n: int

    with pytest.raises(errors.ConfigurationError, match="cannot be carried"):

        class Odd(pgmsg.Event, type="test.odd"):
            x: object.__class__


def test_metadata_carries_correlation_and_causation_ids():
    cause = Opened(owner="gus", metadata={"correlation_id": "req-1"})
    pgmsg.append("account-12", cause)
    recorded = pgmsg.read_stream("account-12")[0]
    pgmsg.append("account-12", Deposited(amount=Decimal(5)).follows(recorded))
    second = pgmsg.read_stream("account-12")[1]
    assert second.metadata == {"correlation_id": "req-1", "causation_id": str(cause.message_id)}
    assert second.event.metadata == second.metadata


def test_unknown_stored_types_raise_when_decoded():
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgmsg_event (stream_name, category, version, type, data, metadata, "
            "message_id) VALUES ('seq-9', 'seq', 1, 'gone.type', '{}', '{}', %s)",
            [uuid.uuid4()],
        )
    recorded = pgmsg.read_stream("seq-9")[0]
    with pytest.raises(errors.UnknownEventType, match="no Event class has type 'gone.type'"):
        recorded.event  # noqa: B018


def test_read_all_pages_through_everything_by_checkpoint_with_filters():
    pgmsg.append("account-1", [Opened(owner="h"), Deposited(amount=Decimal(1))])
    pgmsg.append("seq-1", [Step(n=1), Step(n=2)])
    pgmsg.append("account-2", Withdrawn(amount=Decimal(1)))
    wait_for(lambda: len(pgmsg.read_all()) == 5, message="5 events readable", timeout=180)
    everything, after = [], events.START
    while page := pgmsg.read_all(after, limit=2):
        everything += page
        after = page[-1].checkpoint
    assert [(r.stream_name, r.version) for r in everything] == [
        ("account-1", 1),
        ("account-1", 2),
        ("seq-1", 1),
        ("seq-1", 2),
        ("account-2", 1),
    ]
    assert [r.type for r in pgmsg.read_all(category="seq")] == ["test.step", "test.step"]
    assert [r.stream_name for r in pgmsg.read_all(types=[Deposited, "test.withdrawn"])] == [
        "account-1",
        "account-2",
    ]
    with pytest.raises(errors.InvalidStreamName):
        pgmsg.read_all(category="Bad-category")


def test_read_all_does_not_return_events_of_transactions_still_open():
    from pgmsg_tests.events.test_events_concurrency import open_transaction

    pgmsg.append("seq-1", Step(n=1))
    wait_for(lambda: pgmsg.read_all(), message="seq-1 readable", timeout=180)
    with open_transaction() as other:
        other.append("seq-2", Step(n=2))  # uncommitted: not visible anyway
        pgmsg.append("seq-3", Step(n=3))  # committed, but by a later transaction
        assert [r.stream_name for r in pgmsg.read_all()] == ["seq-1"]
    wait_for(
        lambda: [r.stream_name for r in pgmsg.read_all()] == ["seq-1", "seq-2", "seq-3"],
        message="both later events readable, in transaction order",
        timeout=180,
    )


def test_a_stream_keeps_version_order_in_read_all_when_an_older_transaction_appends_later():
    from pgmsg_tests.events.test_events_concurrency import open_transaction

    with open_transaction() as older:
        older.append("seq-5", Step(n=0))  # this transaction now has the lower id
        pgmsg.append("seq-1", Step(n=1))  # a younger transaction appends version 1 and commits
        older.append("seq-1", Step(n=2))  # then the older one appends version 2
    read = wait_for(lambda: len(pgmsg.read_all()) == 3 and pgmsg.read_all(), timeout=180)
    assert [(r.stream_name, r.version) for r in read] == [("seq-5", 1), ("seq-1", 1), ("seq-1", 2)]


def test_read_order_compares_transaction_ids_as_numbers():
    # Ids of different lengths: as text, '10' would sort before '9'.
    with connection.cursor() as cursor:
        for xid, stream in (("10", "seq-b"), ("9", "seq-a")):
            cursor.execute(
                "INSERT INTO pgmsg_event (stream_name, category, version, type, data, metadata, "
                "message_id, transaction_id) VALUES (%s, 'seq', 1, 'test.step', '{\"n\": 1}', "
                "'{}', gen_random_uuid(), %s::xid8)",
                [stream, xid],
            )
    assert [(r.stream_name, r.transaction_id) for r in pgmsg.read_all()] == [
        ("seq-a", 9),
        ("seq-b", 10),
    ]


def test_a_producer_that_is_not_django_appends_with_pgmsg_append():
    import psycopg

    from pgmsg_dev.devdb import database_url

    call = "SELECT pgmsg_append(%s, %s, %s::text[], %s::text[], %s::text[], %s::uuid[], %s)"
    first, second = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as producer:
        appended = producer.execute(
            call,
            [
                "account-40",
                "account",
                ["test.opened", "test.deposited"],
                ['{"owner": "bo"}', '{"amount": "5"}'],
                ['{"correlation_id": "c-1"}', "{}"],
                [first, second],
                0,
            ],
        ).fetchone()[0]
        assert appended == 2
        # A version that does not match: NULL, and nothing written.
        mismatch = producer.execute(
            call,
            [
                "account-40",
                "account",
                ["test.withdrawn"],
                ['{"amount": "1"}'],
                ["{}"],
                [uuid.uuid4()],
                1,
            ],
        ).fetchone()[0]
        assert mismatch is None
        with pytest.raises(psycopg.errors.UniqueViolation, match="is stored already"):
            producer.execute(
                call,
                [
                    "account-41",
                    "account",
                    ["test.withdrawn"],
                    ['{"amount": "1"}'],
                    ["{}"],
                    [first],
                    None,
                ],
            )
    read = pgmsg.read_stream("account-40")
    assert [r.event for r in read] == [Opened(owner="bo"), Deposited(amount=Decimal("5"))]
    assert [r.message_id for r in read] == [first, second]
    assert read[0].metadata == {"correlation_id": "c-1"}
    assert pgmsg.append("account-40", Withdrawn(amount=Decimal(1)), expected_version=2) == 3
    assert not pgmsg.read_stream("account-41")


# -- append() sends its arrays in PostgreSQL's binary form (wire.text_array, uuid_array) -----

AWKWARD = [
    "",
    'a "quoted" {brace}, comma',
    'back\\slash \\" and \\\\',
    "ünï ☃ 😀",
    "NULL",
    "x" * 5000,
]


@pytest.mark.parametrize("through_django", [False, True])
def test_append_stores_awkward_text_and_metadata_exactly(through_django):
    from django.test import override_settings

    given = [Opened(owner=owner, metadata={"note": owner} if owner else {}) for owner in AWKWARD]
    with override_settings(PGMSG={"SEND_THROUGH_DJANGO_CURSOR": through_django}):
        assert pgmsg.append("awkward-1", given) == len(AWKWARD)
    stored = list(StoredEvent.objects.filter(stream_name="awkward-1").order_by("version"))
    assert [event.data for event in stored] == [{"owner": owner} for owner in AWKWARD]
    assert [event.metadata.get("note", "") for event in stored] == AWKWARD
    assert [event.message_id for event in stored] == [event.message_id for event in given]
    assert [event.version for event in stored] == list(range(1, len(AWKWARD) + 1))


@pytest.mark.wire_fast_path
def test_append_inside_an_execute_wrapper_goes_through_djangos_cursor(monkeypatch):
    """Where Django's cursor is watched, append()'s statement goes through it: an execute
    wrapper (an APM agent, pgtrigger.ignore) sees it, and nothing goes through libpq."""
    from pgmsg.core.wire import protocol

    sent_by_libpq = []
    one_value = protocol.one_value
    monkeypatch.setattr(
        protocol,
        "one_value",
        lambda *args, **options: sent_by_libpq.append(args) or one_value(*args, **options),
    )
    pgmsg.append("plain-1", Opened(owner="n"))
    assert len(sent_by_libpq) == 1
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        assert pgmsg.append("wrapped-1", [Opened(owner="o"), Opened(owner="p")]) == 2
        assert pgmsg.append("wrapped-1", Opened(owner="q"), expected_version=2) == 3
        with pytest.raises(errors.ConcurrencyError):
            pgmsg.append("wrapped-1", Opened(owner="r"), expected_version=2)
    assert len(sent_by_libpq) == 1
    assert sum("pgmsg_append" in sql for sql in seen) >= 3
    stored = StoredEvent.objects.filter(stream_name="wrapped-1").order_by("version")
    assert [event.data["owner"] for event in stored] == ["o", "p", "q"]


def test_append_with_query_logging_on_is_captured():
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        assert pgmsg.append("captured-1", [Opened(owner="a"), Opened(owner="b")]) == 2
    (logged,) = [q["sql"] for q in captured.captured_queries if "pgmsg_append" in q["sql"]]
    assert "captured-1" in logged


@pytest.fixture
def refused_stream():
    with refused_by_the_server("pgmsg_event", "stream_name", "refused-1") as stream:
        yield stream


@pytest.mark.parametrize("in_transaction", [False, True])
@pytest.mark.parametrize("watch", ["execute_wrapper", "capture", "setting"])
def test_an_error_in_append_where_djangos_cursor_is_watched_is_djangos(
    refused_stream, watch, in_transaction
):
    """As from Django's cursor: django.db's DataError (psycopg's DivisionByZero its cause)."""
    import contextlib

    import psycopg
    from django.db import DataError
    from django.test import override_settings
    from django.test.utils import CaptureQueriesContext

    watching = {
        "execute_wrapper": connection.execute_wrapper(lambda execute, *args: execute(*args)),
        "capture": CaptureQueriesContext(connection),
        "setting": override_settings(PGMSG={"SEND_THROUGH_DJANGO_CURSOR": True}),
    }[watch]
    block = transaction.atomic() if in_transaction else contextlib.nullcontext()
    with watching, pytest.raises(DataError) as raised, block:
        pgmsg.append(refused_stream, Opened(owner="x"))
    assert not isinstance(raised.value, psycopg.Error)
    assert isinstance(raised.value.__cause__, psycopg.errors.DivisionByZero)


@pytest.fixture
def libpq_appends(monkeypatch):
    """The appends that went through libpq (the real functions, counted as (path, stream)):
    the full path's one_value, and the shorter one a connection takes once it has been
    through it."""
    from pgmsg.core.wire import protocol, sends

    calls = []
    real, real_hot = protocol.one_value, sends._kept_value

    def counted(conn, statement, values, **options):
        calls.append(("full", values[0]))
        return real(conn, statement, values, **options)

    def counted_hot(db, hot, statement, params):
        value = real_hot(db, hot, statement, params)
        if value is not sends.NOT_SENT:
            calls.append(("kept", params["stream"]))
        return value

    monkeypatch.setattr(protocol, "one_value", counted)
    monkeypatch.setattr(sends, "_kept_value", counted_hot)
    return calls


@pytest.mark.wire_fast_path
def test_after_its_first_append_the_shorter_path_still_notices_what_changes_between_calls(
    libpq_appends,
):
    """append() checks less once its connection has sent through libpq (sends._kept_value); it
    must still notice everything that can change from one call to the next, and keep its
    answers: a retried append, a version mismatch, a duplicate id, a rollback."""
    from django.db.transaction import TransactionManagementError
    from django.test import override_settings
    from django.test.utils import CaptureQueriesContext

    assert pgmsg.append("kept-1", Opened(owner="first")) == 1
    retried = Opened(owner="second")
    assert pgmsg.append("kept-1", retried) == 2
    assert libpq_appends == [("full", "kept-1"), ("kept", "kept-1")]
    # Answers that need the stream locked, from the shorter path's IntegrityError or None.
    assert pgmsg.append("kept-1", retried) == 2
    with pytest.raises(errors.DuplicateMessageId):
        pgmsg.append("kept-1", [Opened(owner="new"), retried])
    with pytest.raises(errors.ConcurrencyError):
        pgmsg.append("kept-1", Opened(owner="stale"), expected_version=1)
    assert pgmsg.append("kept-1", Opened(owner="third"), expected_version=2) == 3
    del libpq_appends[:]
    with connection.execute_wrapper(lambda execute, *args: execute(*args)):
        assert pgmsg.append("kept-1", Opened(owner="wrapped")) == 4
    with CaptureQueriesContext(connection):
        assert pgmsg.append("kept-1", Opened(owner="captured")) == 5
    with override_settings(PGMSG={"SEND_THROUGH_DJANGO_CURSOR": True}):
        assert pgmsg.append("kept-1", Opened(owner="through django")) == 6
    assert libpq_appends == []
    assert pgmsg.append("kept-1", Opened(owner="warm")) == 7
    with transaction.atomic():
        pgmsg.append("kept-1", Opened(owner="rolled back"))
        with pytest.raises(RuntimeError), transaction.atomic(savepoint=False):
            raise RuntimeError
        with pytest.raises(TransactionManagementError):
            pgmsg.append("kept-1", Opened(owner="broken block"))
    refused = refused_in_another_thread(lambda: pgmsg.append("kept-1", Opened(owner="thread")))
    assert refused and "thread" in str(refused[0])
    assert pgmsg.append("kept-1", Opened(owner="warm")) == 8
    connection.close()
    assert pgmsg.append("kept-1", Opened(owner="new connection")) == 9
    connection.connection.execute("DEALLOCATE ALL")  # behind pgmsg's back, in autocommit
    assert pgmsg.append("kept-1", Opened(owner="prepared anew")) == 10
    # warm after PGMSG was overridden: full; the rolled back one (in the block's savepoint) and
    # the warm one after the thread: kept; a new connection, and statements gone: full.
    assert [path for path, _ in libpq_appends] == ["full", "kept", "kept", "full", "full"]
    stored = StoredEvent.objects.filter(stream_name="kept-1").order_by("version")
    assert [event.data["owner"] for event in stored] == [
        "first", "second", "third", "wrapped", "captured", "through django", "warm", "warm",
        "new connection", "prepared anew",
    ]  # fmt: skip
