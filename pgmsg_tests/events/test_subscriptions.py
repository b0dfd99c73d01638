"""Subscriptions, run by an in-process worker: checkpoints, partitions, failures, operations.

Events become readable once every older transaction in the cluster has ended; other sessions
on the shared test server can delay that, so tests drain until what must happen has happened.
"""

from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.db import connection

import pgmsg
from pgmsg.core import errors
from pgmsg.core.sources import SourceOptions
from pgmsg.core.worker import Worker
from pgmsg.events import serving, source, subscription_operations, subscriptions
from pgmsg.models import SubscriptionPartition
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.testapp.events_handlers import Deposited, Opened, Step, Withdrawn
from pgmsg_tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

#: A long transaction of another session on the shared server holds every reader back; this
#: only bounds a broken run.
HORIZON_TIMEOUT = 180


def drain(name: str, *, batch_size: int | None = None) -> Worker:
    worker = Worker(
        subscriptions=[name], until_idle=True, install_signal_handlers=False, batch_size=batch_size
    )
    worker.run()
    return worker


def drain_until(name: str, predicate, *, message: str, batch_size: int | None = None):
    return wait_for(
        lambda: (drain(name, batch_size=batch_size), predicate())[1],
        message=message,
        timeout=HORIZON_TIMEOUT,
    )


def effects(channel: str) -> list[Effect]:
    return list(Effect.objects.filter(channel=channel).order_by("id"))


def partition_of(stream: str, partitions: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT abs(mod(hashtextextended(%s, 0), %s))", [stream, partitions])
        return cursor.fetchone()[0]


def test_each_event_is_handled_once_in_stream_order_across_batches():
    for round_ in range(3):
        for s in range(5):
            pgmsg.append(f"seq-{s}", [Step(n=round_ * 10 + i) for i in range(4)])
    drain_until(
        "test-seq", lambda: len(effects("sub.seq")) == 60, batch_size=7, message="60 steps handled"
    )
    drain("test-seq")
    handled = effects("sub.seq")
    assert len({e.key for e in handled}) == 60
    for s in range(5):
        assert [e.data["version"] for e in handled if e.listener == f"seq-{s}"] == list(
            range(1, 13)
        )
    rows = SubscriptionPartition.objects.filter(subscription="test-seq")
    assert sorted(r.partition for r in rows) == [0, 1, 2, 3]
    assert sum(r.handled for r in rows) == 60


#: Notes, at each commit that moves a partition's checkpoint, how many events it handled and
#: the transaction's synchronous_commit (a deferred trigger fires at COMMIT, after SET LOCAL).
COMMIT_MODE_TRIGGER = """
CREATE TABLE test_commit_mode (handled bigint, synchronous_commit text);
CREATE FUNCTION test_note_commit_mode() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_commit_mode
    VALUES (NEW.handled - OLD.handled, current_setting('synchronous_commit'));
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER test_note_commit_mode AFTER UPDATE ON pgmsg_subscription_partition
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_note_commit_mode();
"""


def test_a_batch_that_read_nothing_commits_without_waiting_for_the_flush_one_that_handled_waits(
    monkeypatch,
):
    # Every look that finds nothing moves the checkpoint to the horizon (a write to commit).
    monkeypatch.setattr(source, "IDLE_ADVANCE_XIDS", 0)
    with connection.cursor() as cursor:
        # The worker runs on this session: what it commits with, unless it turns it off.
        cursor.execute("SET synchronous_commit = on")
        cursor.execute(COMMIT_MODE_TRIGGER)
    try:
        pgmsg.append("audit-commit", [Opened(owner="ann")])
        drain_until(
            "test-audit", lambda: len(effects("sub.audit")) == 1, message="the event handled"
        )
        drain("test-audit")  # looks that find nothing (their own commits move the horizon)
        drain("test-audit")
        with connection.cursor() as cursor:
            cursor.execute("SELECT handled, synchronous_commit FROM test_commit_mode")
            modes = cursor.fetchall()
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "DROP TRIGGER test_note_commit_mode ON pgmsg_subscription_partition;"
                "DROP FUNCTION test_note_commit_mode(); DROP TABLE test_commit_mode;"
                "RESET synchronous_commit"
            )
    assert {mode for handled, mode in modes if handled} == {"on"}
    assert {mode for handled, mode in modes if not handled} == {"off"}


def partition_row(subscription: str) -> tuple[str, int]:
    """(the row version's xmin, the checkpoint's transaction) of a one-partition subscription."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xmin::text, checkpoint_transaction FROM pgmsg_subscription_partition "
            "WHERE subscription = %s",
            [subscription],
        )
        return cursor.fetchone()


def test_looks_that_find_nothing_write_nothing_until_the_horizon_is_far_ahead(monkeypatch):
    pgmsg.append("audit-idle", [Opened(owner="ann")])
    drain_until("test-audit", lambda: len(effects("sub.audit")) == 1, message="the event handled")
    handled = partition_row("test-audit")
    # Each look holds the partition, so each has a transaction id and moves the horizon.
    for _ in range(3):
        drain("test-audit")
    assert partition_row("test-audit") == handled  # not even rewritten in place

    monkeypatch.setattr(source, "IDLE_ADVANCE_XIDS", 5)
    with connection.cursor() as cursor:
        for _ in range(6):  # six transactions of their own, each with an id
            cursor.execute("SELECT pg_current_xact_id()")
    drain_until(
        "test-audit",
        lambda: partition_row("test-audit")[1] >= handled[1] + 5,
        message="the checkpoint moved to the horizon",
    )
    assert len(effects("sub.audit")) == 1


def test_only_handled_types_of_the_category_reach_the_handlers():
    pgmsg.append(
        "account-1",
        [Opened(owner="ann"), Deposited(amount=Decimal(5)), Withdrawn(amount=Decimal(2))],
    )
    pgmsg.append("seq-1", Step(n=1))  # another category
    drain_until("test-ledger", lambda: len(effects("sub.ledger")) == 2, message="2 handled")
    assert [e.data["amount"] for e in effects("sub.ledger")] == ["5", "-2"]


def test_appends_made_by_a_handler_commit_with_the_checkpoint_and_record_their_cause():
    pgmsg.append("account-2", Deposited(amount=Decimal(1000), metadata={"correlation_id": "c1"}))
    drain_until("test-ledger", lambda: effects("sub.ledger"), message="deposit handled")
    caused = pgmsg.read_stream("audit-account-2")
    cause = pgmsg.read_stream("account-2")[0]
    assert [r.event.tag for r in caused] == ["large"]
    assert caused[0].metadata == {"causation_id": str(cause.message_id), "correlation_id": "c1"}


def test_a_failing_event_stops_its_partition_only_and_is_reported_until_skipped():
    bad_stream, good_stream = "fragile-a", "fragile-b"
    assert partition_of(bad_stream, 2) != partition_of(good_stream, 2)
    pgmsg.append(bad_stream, [Step(n=1), Step(n=2, fail=True, tag="t1"), Step(n=3)])
    pgmsg.append(good_stream, [Step(n=1), Step(n=2)])
    bad = partition_of(bad_stream, 2)

    def stopped():
        return SubscriptionPartition.objects.filter(
            subscription="test-fragile", status="stopped"
        ).first()

    row = drain_until("test-fragile", stopped, message="partition stopped after 2 attempts")
    assert row.partition == bad and row.attempts == 2
    assert "RuntimeError: step 2 of fragile-a fails" in row.last_error
    failed = pgmsg.read_stream(bad_stream)[1]
    assert row.failed_position == failed.position
    # The other partition carried on; the failed attempts left no effect behind.
    drain_until("test-fragile", lambda: len(effects("sub.fragile")) == 3, message="3 effects")
    assert sorted((e.listener, e.data["n"]) for e in effects("sub.fragile")) == [
        ("fragile-a", 1),
        ("fragile-b", 1),
        ("fragile-b", 2),
    ]
    # Operators see it.
    call_command("pgmsg_subscriptions", "status", "test-fragile", stdout=(out := _Out()))
    handled_first = pgmsg.read_stream(bad_stream)[0].position
    assert "stopped\tbehind=2 events, " in out.text  # the failed step 2 and step 3
    assert f"\tlast_handled={handled_first}\t" in out.text
    assert "RuntimeError: step 2 of fragile-a fails" in out.text
    drain("test-fragile")  # a stopped partition stays stopped
    assert len(effects("sub.fragile")) == 3
    call_command("pgmsg_subscriptions", "skip", "test-fragile", stdout=_Out())
    drain_until("test-fragile", lambda: len(effects("sub.fragile")) == 4, message="step 3")
    assert effects("sub.fragile")[-1].data["n"] == 3  # step 2 was passed over
    row = SubscriptionPartition.objects.get(subscription="test-fragile", partition=bad)
    assert (row.status, row.attempts, row.last_error, row.failed_position) == (
        "active",
        0,
        "",
        None,
    )


def test_retry_runs_the_failed_event_again_once_the_cause_is_fixed():
    pgmsg.append("fragile-c", [Step(n=1, fail=True, tag="t2"), Step(n=2)])
    drain_until(
        "test-fragile",
        lambda: SubscriptionPartition.objects.filter(status="stopped").exists(),
        message="stopped",
    )
    Effect.objects.create(channel="switch", key="t2")  # the fix
    assert subscription_operations.retry("test-fragile") == 1
    drain_until(
        "test-fragile",
        lambda: [e.data["n"] for e in effects("sub.fragile")][-2:] == [1, 2],
        message="steps 1 and 2 handled after the retry",
    )
    assert not SubscriptionPartition.objects.filter(status="stopped").exists()


def test_an_event_that_cannot_be_decoded_stops_its_partition_at_once():
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgmsg_event (stream_name, category, version, type, data, metadata, "
            "message_id) VALUES ('fragile-e', 'fragile', 1, 'test.step', '{\"n\": \"one\"}', "
            "'{}', gen_random_uuid())"
        )
    row = drain_until(
        "test-fragile",
        lambda: SubscriptionPartition.objects.filter(status="stopped").first(),
        message="stopped",
    )
    assert row.attempts == 1 and row.last_error.startswith("not retried")
    assert "Step.n: 'one' is not a valid int" in row.last_error
    assert effects("sub.fragile") == []


def test_reset_replays_from_the_beginning_from_a_position_or_skips_to_the_end():
    pgmsg.append("seq-r", [Step(n=i) for i in range(1, 6)])
    drain_until("test-seq", lambda: len(effects("sub.seq")) == 5, message="5 handled")
    assert subscription_operations.reset("test-seq") == 4
    drain_until("test-seq", lambda: len(effects("sub.seq")) == 10, message="replayed")
    third = pgmsg.read_stream("seq-r")[2].position
    call_command("pgmsg_subscriptions", "reset", "test-seq", "--to", str(third), stdout=_Out())
    drain_until("test-seq", lambda: len(effects("sub.seq")) == 12, message="after the third")
    assert [e.data["n"] for e in effects("sub.seq")][10:] == [4, 5]
    subscription_operations.reset("test-seq", to="end")
    pgmsg.append("seq-r", Step(n=6))
    drain_until("test-seq", lambda: len(effects("sub.seq")) == 13, message="only the new one")
    assert effects("sub.seq")[-1].data["n"] == 6
    with pytest.raises(errors.ConfigurationError, match="partitions 0..3, not \\[7\\]"):
        subscription_operations.reset("test-seq", partitions=[7])
    with pytest.raises(errors.UnknownSubscription, match="no subscription named 'nope'"):
        subscription_operations.reset("nope")


def test_a_subscription_starting_now_passes_over_what_was_stored_before():
    pgmsg.append("late-1", Step(n=1))
    wait_for(
        lambda: pgmsg.read_all(category="late"),
        message="the old event is final",
        timeout=HORIZON_TIMEOUT,
    )
    drain("test-late")  # creates the partition at the horizon
    pgmsg.append("late-1", Step(n=2))
    drain_until("test-late", lambda: effects("sub.late"), message="the new event")
    drain("test-late")
    assert [e.data["n"] for e in effects("sub.late")] == [2]


def test_partitions_follow_a_data_field_when_asked():
    sub = pgmsg.Subscription(
        "test-by-owner", category="account", partitions=3, partition_by="data.owner"
    )
    seen = []
    sub.handler(Opened)(lambda recorded: seen.append(recorded.event.owner))
    try:
        for i in range(6):
            pgmsg.append(f"account-{i}", Opened(owner=f"o{i % 2}"))
        drain_until("test-by-owner", lambda: len(seen) == 6, message="6 opened")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT partition, handled FROM pgmsg_subscription_partition "
                "WHERE subscription = 'test-by-owner' AND handled > 0"
            )
            used = dict(cursor.fetchall())
        expected = {}
        for owner in ("o0", "o1"):
            with connection.cursor() as cursor:
                cursor.execute("SELECT abs(mod(hashtextextended(%s, 0), 3))", [owner])
                part = cursor.fetchone()[0]
            expected[part] = expected.get(part, 0) + 3
        assert used == expected
    finally:
        subscriptions.registry.subscriptions.pop("test-by-owner")


def test_declarations_are_checked():
    with pytest.raises(errors.InvalidName, match="invalid subscription name 'Bad Name'"):
        pgmsg.Subscription("Bad Name")
    with pytest.raises(errors.ConfigurationError, match="partitions must be an int"):
        pgmsg.Subscription("test-x", partitions=0)
    with pytest.raises(errors.ConfigurationError, match="partition_by must be"):
        pgmsg.Subscription("test-x", partition_by="stream_name")
    with pytest.raises(errors.ConfigurationError, match="start must be"):
        pgmsg.Subscription("test-x", start="yesterday")
    with pytest.raises(errors.ConfigurationError, match="declared twice with different"):
        pgmsg.Subscription("test-seq", category="seq", partitions=8)
    with pytest.raises(errors.InvalidStreamName):
        pgmsg.Subscription("test-x", category="Seq")
    assert "test-x" not in subscriptions.registry.subscriptions


def test_changing_the_partition_count_of_a_subscription_that_ran_is_refused():
    drain("test-seq")
    sub = subscriptions.registry.get("test-seq")
    changed = subscriptions.Subscription.__new__(subscriptions.Subscription)
    changed.__dict__.update(sub.__dict__, partitions=8)
    with (
        connection.cursor() as cursor,
        pytest.raises(
            errors.ConfigurationError, match="declares 8 partitions but the database holds 4"
        ),
    ):
        subscriptions.ensure_partitions(changed, cursor)


def test_worker_sources_serve_what_is_named_and_wake_on_their_category():
    with pytest.raises(errors.UnknownSubscription, match="known subscriptions: .*'test-seq'"):
        Worker(subscriptions=["nope"], install_signal_handlers=False)
    everything = serving.worker_sources(SourceOptions(True, {}, None))
    assert {"test-seq", "test-audit", "test-ledger"} <= {s.sub.name for s in everything}
    [seq] = serving.worker_sources(SourceOptions(False, {"subscriptions": ["test-seq"]}, (1, 2)))
    assert seq.mine == [1, 3]
    assert seq.wants("events:seq") and seq.wants("events")
    assert not seq.wants("events:account") and not seq.wants("inbox:seq")
    [audit] = serving.worker_sources(SourceOptions(False, {"subscriptions": ["test-audit"]}, None))
    assert audit.wants("events:account") and not audit.wants("test.work")


class _Out:
    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def test_admin_lists_stopped_partitions_with_the_error_and_retries_with_permission(client):
    pgmsg.append("fragile-d", Step(n=1, fail=True, tag="t3"))
    row = drain_until(
        "test-fragile",
        lambda: SubscriptionPartition.objects.filter(status="stopped").first(),
        message="stopped",
    )
    staff = User.objects.create_user("op", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_subscriptionpartition"))
    client.force_login(staff)
    url = "/admin/pgmsg/subscriptionpartition/"
    page = client.get(url + "?state=stopped")
    assert page.status_code == 200
    assert "RuntimeError: step 1 of fragile-d fails" in page.content.decode()
    assert "1 event, " in page.content.decode()  # behind the head: the failed event
    assert "retry_selected" not in page.content.decode()  # no operate permission
    staff.user_permissions.add(Permission.objects.get(codename="operate_subscriptionpartition"))
    staff = User.objects.get(pk=staff.pk)
    client.force_login(staff)
    assert "retry_selected" in client.get(url).content.decode()
    client.post(url, {"action": "retry_selected", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert (row.status, row.attempts) == ("active", 0)
    staff.user_permissions.add(Permission.objects.get(codename="view_storedevent"))
    client.force_login(User.objects.get(pk=staff.pk))
    events_page = client.get("/admin/pgmsg/storedevent/")
    assert events_page.status_code == 200 and "fragile-d" in events_page.content.decode()
