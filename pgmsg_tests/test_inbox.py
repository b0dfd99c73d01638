"""The transactional inbox in one process: receipt, handlers, priority, partitions, dead letters,
replay, discard, retention, health, the command and the JSON endpoint."""

import json
from collections import Counter
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.models.functions import Now

import pgmsg
from pgmsg import errors, inbox_ops
from pgmsg.devdb import database_url
from pgmsg.inbox import registry
from pgmsg.models import InboxMessage
from pgmsg.worker import Worker
from pgmsg_tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def drain(*inboxes: str, batch_size: int | None = None, partition=None) -> Worker:
    worker = Worker(
        inboxes=list(inboxes) or ["test.inbox"],
        until_idle=True,
        install_signal_handlers=False,
        batch_size=batch_size,
        partition=partition,
    )
    worker.run()
    return worker


def effects(channel: str = "inbox:test.inbox") -> Counter:
    return Counter(Effect.objects.filter(channel=channel).values_list("key", flat=True))


def make_due_now() -> None:
    InboxMessage.objects.filter(status="pending").update(available_at=Now())


def status_of(message_id: str, inbox: str = "test.inbox") -> InboxMessage:
    return InboxMessage.objects.get(inbox=inbox, message_id=message_id)


# -- declaring and receiving ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "Upper", "has space", "x" * 58, "semi;colon", None])
def test_bad_inbox_names_are_refused_with_the_name_quoted(name):
    with pytest.raises(errors.InvalidName, match="inbox"):
        pgmsg.Inbox(name)


def test_an_inbox_redeclared_with_other_options_is_refused():
    with pytest.raises(errors.InboxAlreadyDeclared, match="test.inbox"):
        pgmsg.Inbox("test.inbox", ordered=True)
    assert pgmsg.Inbox(
        "test.inbox", max_attempts=3, priorities={"urgent": 0, "normal": 5}
    ) == registry.get("test.inbox")


@pytest.mark.parametrize(
    "options, complaint",
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"priorities": {"a": "high"}}, "priority of 'a'"),
        ({"priorities": {"a": 2**40}}, "priority of 'a'"),
        ({"ordered": "yes"}, "ordered"),
    ],
)
def test_bad_inbox_options_are_refused(options, complaint):
    with pytest.raises(errors.ConfigurationError, match=complaint):
        pgmsg.Inbox("test.bad-options", **options)


def test_receive_stores_once_and_reports_the_duplicate():
    first = pgmsg.receive(
        "test.inbox",
        "m-1",
        type="work",
        payload={"a": 1},
        source="webhook",
        aggregate_id=7,
        trace_id="t-1",
    )
    again = pgmsg.receive("test.inbox", "m-1", type="work", payload={"a": 2})
    assert first.stored and first.id and not first.duplicate
    assert again.duplicate and again.id is None
    row = status_of("m-1")
    assert (row.payload, row.source, row.aggregate_id, row.trace_id, row.status) == (
        {"a": 1},
        "webhook",
        "7",
        "t-1",
        "pending",
    )


def test_the_same_message_id_in_two_inboxes_is_two_messages():
    assert pgmsg.receive("test.inbox", "shared", type="work", payload={}).stored
    assert pgmsg.receive("test.ordered", "shared", type="step", payload={"seq": 0}).stored


def test_receive_many_reports_each_message_and_dedups_within_the_batch():
    pgmsg.receive("test.inbox", "b-0", type="work", payload={})
    results = pgmsg.receive_many(
        "test.inbox",
        [
            {"message_id": "b-0", "type": "work", "payload": {}},
            {"message_id": "b-1", "type": "work", "payload": {"n": 1}},
            {"message_id": "b-1", "type": "work", "payload": {"n": 2}},
            {"message_id": "b-2", "type": "low", "payload": [1, 2], "aggregate_id": "x"},
        ],
    )
    assert [r.stored for r in results] == [False, True, False, True]
    assert InboxMessage.objects.get(message_id="b-1").payload == {"n": 1}


def test_a_rolled_back_receive_stores_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        pgmsg.receive("test.inbox", "rolled-back", type="work", payload={})
        raise RuntimeError("abort")
    assert not InboxMessage.objects.filter(message_id="rolled-back").exists()


@pytest.mark.parametrize(
    "kwargs, complaint",
    [
        ({"message_id": ""}, "message_id must be a non-empty string"),
        ({"type": None}, "type must be a non-empty string"),
        ({"payload": {"x": object()}}, "not JSON-serialisable"),
        ({"payload": float("nan")}, "not JSON-serialisable"),
        ({"aggregate_id": ""}, "aggregate_id"),
        ({"trace_id": 5}, "trace_id must be a string"),
    ],
)
def test_bad_messages_get_precise_errors(kwargs, complaint):
    args = {"message_id": "m", "type": "work", "payload": {}, **kwargs}
    with pytest.raises(errors.InvalidMessage, match=complaint):
        pgmsg.receive("test.inbox", **args)


def test_receiving_into_an_undeclared_inbox_is_refused_with_the_known_names():
    with pytest.raises(errors.UnknownInbox, match=r"'test.nope'.*test.inbox"):
        pgmsg.receive("test.nope", "m", type="work", payload={})


def test_sql_producers_insert_with_on_conflict_and_the_trigger_notifies():
    listener = psycopg.connect(database_url(connection.settings_dict), autocommit=True)
    try:
        listener.execute("LISTEN pgmsg")
        with connection.cursor() as cursor:
            sql = (
                "INSERT INTO pgmsg_inbox_message (inbox, message_id, type, payload) "
                "VALUES (%s, %s, %s, %s::jsonb) ON CONFLICT DO NOTHING"
            )
            cursor.execute(sql, ["test.inbox", "sql-1", "work", '{"from": "sql"}'])
            cursor.execute(sql, ["test.inbox", "sql-1", "work", '{"from": "again"}'])
            assert cursor.rowcount == 0
        got = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
        assert got == ["inbox:test.inbox"]
        # An all-duplicate insert wakes nobody.
        with connection.cursor() as cursor:
            cursor.execute(sql, ["test.inbox", "sql-1", "work", "{}"])
        assert [n.payload for n in listener.notifies(timeout=0.3)] == []
    finally:
        listener.close()
    drain()
    assert effects() == {"sql-1": 1}
    assert status_of("sql-1").processed_at is not None


# -- processing ----------------------------------------------------------------------------


def test_handlers_get_the_message_and_commit_with_the_processed_mark():
    pgmsg.receive(
        "test.inbox",
        "h-1",
        type="work",
        payload={"k": [1, "two"]},
        source="svc",
        aggregate_id="a1",
        trace_id="trace",
    )
    assert drain().handled == 1
    effect = Effect.objects.get(key="h-1")
    assert effect.data == {
        "aggregate": "a1",
        "attempts": 0,
        "trace_id": "trace",
        "source": "svc",
        "payload": {"k": [1, "two"]},
    }
    row = status_of("h-1")
    assert (row.status, row.attempts) == ("processed", 0) and row.processed_at


def test_priority_map_lower_first_unmapped_last_then_arrival_order():
    kinds = ["low", "normal", "urgent", "work", "normal", "urgent", "low"]
    for i, kind in enumerate(kinds):
        pgmsg.receive("test.inbox", f"p-{i}", type=kind, payload={})
    drain(batch_size=2)
    order = list(Effect.objects.order_by("id").values_list("key", flat=True))
    # urgent (0), normal (5), then the unmapped types in arrival order
    assert order == ["p-2", "p-5", "p-1", "p-4", "p-0", "p-3", "p-6"]


def test_partitions_split_aggregates_by_a_stable_hash_without_overlap():
    for i in range(40):
        pgmsg.receive("test.inbox", f"s-{i}", type="work", payload={}, aggregate_id=f"agg-{i % 8}")
    drain(partition=(0, 2))
    first = set(effects())
    drain(partition=(1, 2))
    both = effects()
    assert 0 < len(first) < 40
    assert sum(both.values()) == 40 and set(both.values()) == {1}
    # A share is whole aggregates.
    aggregates = dict(InboxMessage.objects.values_list("message_id", "aggregate_id"))
    firsts = {aggregates[k] for k in first}
    assert not firsts & {aggregates[k] for k in set(both) - first}


def test_partitions_of_an_ordered_inbox_take_whole_aggregates_in_order():
    for seq in range(3):
        for a in range(8):
            pgmsg.receive(
                "test.ordered",
                f"po-{a}-{seq}",
                type="step",
                aggregate_id=f"pa-{a}",
                payload={"seq": seq},
            )
    drain("test.ordered", partition=(1, 2))
    first = set(effects("inbox:test.ordered"))
    drain("test.ordered", partition=(0, 2))
    done = effects("inbox:test.ordered")
    assert 0 < len(first) < 24 and len(first) % 3 == 0
    assert sum(done.values()) == 24 and set(done.values()) == {1}
    assert not {k.split(":")[0] for k in first} & {k.split(":")[0] for k in set(done) - first}
    rows = Effect.objects.filter(channel="inbox:test.ordered").order_by("id")
    assert all(r.data["previous_done"] for r in rows)


def test_failures_retry_with_backoff_then_dead_letter_with_the_error_and_count():
    pgmsg.receive("test.inbox", "r-1", type="work", payload={"fail_times": 10})
    drain()
    row = status_of("r-1")
    assert (row.status, row.attempts) == ("pending", 1)
    assert "fails on attempt 1" in row.last_error and row.available_at > row.last_failed_at
    for _ in range(2):
        make_due_now()
        drain()
    row = status_of("r-1")
    assert (row.status, row.attempts) == ("dead", 3)  # test.inbox: max_attempts=3
    assert "fails on attempt 3" in row.last_error
    assert effects() == {}


def test_a_retry_that_succeeds_is_processed_once_with_its_attempts_kept():
    pgmsg.receive("test.inbox", "r-2", type="work", payload={"fail_times": 1})
    drain()
    make_due_now()
    drain()
    row = status_of("r-2")
    assert (row.status, row.attempts) == ("processed", 1)
    assert "fails on attempt 1" in row.last_error
    assert effects() == {"r-2": 1}


def test_an_unknown_type_is_dead_at_once_with_the_reason():
    pgmsg.receive("test.inbox", "u-1", type="no.such.type", payload={})
    pgmsg.receive("test.inbox", "u-2", type="work", payload={})
    drain()
    row = status_of("u-1")
    assert (row.status, row.attempts) == ("dead", 1)
    assert "no handler for message type 'no.such.type'" in row.last_error
    assert effects() == {"u-2": 1}


def test_dead_letters_replay_by_id_and_by_type():
    for i in range(3):
        pgmsg.receive(
            "test.inbox",
            f"d-{i}",
            type="work" if i < 2 else "low",
            payload={"fail_unless_fixed": True},
        )
    for _ in range(3):
        drain()
        make_due_now()
    assert set(InboxMessage.objects.values_list("status", flat=True)) == {"dead"}
    for i in range(3):
        Effect.objects.create(key=f"fixed:d-{i}")
    d0 = status_of("d-0").id
    assert inbox_ops.replay("test.inbox", [d0]) == 1
    drain()
    assert effects() == {"d-0": 1}
    assert inbox_ops.replay("test.inbox", type="low") == 1
    drain()
    assert effects() == {"d-0": 1, "d-2": 1}
    assert status_of("d-1").status == "dead"
    assert status_of("d-2").attempts == 0  # a replay starts the count afresh


def test_discard_keeps_the_reason_and_needs_one():
    pgmsg.receive("test.inbox", "x-1", type="nope", payload={})
    drain()
    with pytest.raises(errors.InvalidMessage, match="reason"):
        inbox_ops.discard("test.inbox", [status_of("x-1").id], reason=" ")
    assert inbox_ops.discard("test.inbox", [status_of("x-1").id], reason="sender bug #12") == 1
    row = status_of("x-1")
    assert (row.status, row.discard_reason) == ("discarded", "sender bug #12")
    assert row.discarded_at is not None


def test_ordered_inbox_a_dead_head_holds_its_aggregate_back_and_is_reported():
    for seq in range(3):
        pgmsg.receive(
            "test.ordered",
            f"a-{seq}",
            type="step",
            aggregate_id="A",
            payload={"seq": seq, "fail_unless_fixed": seq == 0},
        )
        pgmsg.receive(
            "test.ordered", f"b-{seq}", type="step", aggregate_id="B", payload={"seq": seq}
        )
    for _ in range(2):  # max_attempts=2
        drain("test.ordered")
        make_due_now()
    assert effects("inbox:test.ordered") == {"B:0": 1, "B:1": 1, "B:2": 1}
    head = status_of("a-0", "test.ordered")
    assert head.status == "dead"
    [gap] = inbox_ops.gaps("test.ordered")
    assert (gap.aggregate_id, gap.head_id, gap.status, gap.attempts, gap.waiting) == (
        "A",
        head.id,
        "dead",
        2,
        2,
    )
    # The rest stays pending behind it, however often a worker looks.
    drain("test.ordered")
    assert status_of("a-1", "test.ordered").status == "pending"
    # Discarding the head lets the aggregate move on, in order.
    inbox_ops.discard("test.ordered", [head.id], reason="obsolete")
    drain("test.ordered")
    assert effects("inbox:test.ordered") == {"B:0": 1, "B:1": 1, "B:2": 1, "A:1": 1, "A:2": 1}
    assert inbox_ops.gaps("test.ordered") == []


def test_ordered_inbox_a_replayed_head_runs_before_the_messages_behind_it():
    for seq in range(3):
        pgmsg.receive(
            "test.ordered",
            f"c-{seq}",
            type="step",
            aggregate_id="C",
            payload={"seq": seq, "fail_unless_fixed": seq == 0},
        )
    for _ in range(2):
        drain("test.ordered")
        make_due_now()
    Effect.objects.create(key="fixed:c-0")
    inbox_ops.replay("test.ordered", type="step")
    drain("test.ordered")
    keys = list(
        Effect.objects.filter(channel="inbox:test.ordered")
        .order_by("id")
        .values_list("key", flat=True)
    )
    assert keys == ["C:0", "C:1", "C:2"]


def test_ordered_inbox_skips_an_aggregate_another_session_holds():
    for agg in ("held", "free"):
        for seq in range(2):
            pgmsg.receive(
                "test.ordered", f"{agg}-{seq}", type="step", aggregate_id=agg, payload={"seq": seq}
            )
    other = psycopg.connect(database_url(connection.settings_dict), autocommit=True)
    try:
        # What a worker busy with aggregate "held" holds for the length of its transaction.
        other.execute("SELECT pg_advisory_lock(hashtext('test.ordered'), hashtext('held'))")
        drain("test.ordered")
        assert effects("inbox:test.ordered") == {"free:0": 1, "free:1": 1}
    finally:
        other.close()
    drain("test.ordered")
    assert effects("inbox:test.ordered") == {"free:0": 1, "free:1": 1, "held:0": 1, "held:1": 1}


def test_ordered_inbox_messages_without_aggregate_are_processed_too():
    pgmsg.receive("test.ordered", "loose", type="step", payload={"seq": 0})
    drain("test.ordered")
    assert status_of("loose", "test.ordered").status == "processed"


# -- operating -----------------------------------------------------------------------------


def _age(message_id: str, hours: float, column: str, inbox: str = "test.inbox") -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE pgmsg_inbox_message SET {column} = now() - make_interval(hours => %s) "
            "WHERE inbox = %s AND message_id = %s",
            [hours, inbox, message_id],
        )


def test_retention_deletes_old_processed_and_older_dead_but_keeps_blocking_heads():
    for key in ("old", "new"):
        pgmsg.receive("test.inbox", f"ret-{key}", type="work", payload={})
    for key in ("old-dead", "new-dead"):
        pgmsg.receive("test.inbox", f"ret-{key}", type="nope", payload={})
    pgmsg.receive("test.ordered", "blocker", type="nope", aggregate_id="Z", payload={})
    pgmsg.receive("test.ordered", "behind", type="step", aggregate_id="Z", payload={"seq": 1})
    drain()
    drain("test.ordered")
    _age("ret-old", 73, "processed_at")
    _age("ret-new", 71, "processed_at")
    for key, hours in (("ret-old-dead", 24 * 8), ("ret-new-dead", 24 * 6)):
        _age(key, hours, "received_at")
        _age(key, hours, "last_failed_at")
    _age("blocker", 24 * 30, "received_at", "test.ordered")
    _age("blocker", 24 * 30, "last_failed_at", "test.ordered")
    assert inbox_ops.purge() == {"processed": 1, "dead": 1}
    assert set(InboxMessage.objects.values_list("message_id", flat=True)) == {
        "ret-new",
        "ret-new-dead",
        "blocker",
        "behind",
    }


def test_the_worker_runs_retention_itself():
    pgmsg.receive("test.inbox", "wr-old", type="work", payload={})
    drain()
    _age("wr-old", 100, "processed_at")
    drain()
    assert not InboxMessage.objects.filter(message_id="wr-old").exists()


def test_health_states_by_threshold(settings):
    [h] = pgmsg.inbox_health(["test.inbox"])
    assert (h.status, h.pending, h.dead, h.processed_last_minute) == ("healthy", 0, 0, 0)
    pgmsg.receive("test.inbox", "ok", type="work", payload={})
    pgmsg.receive("test.inbox", "bad", type="nope", payload={})
    drain()
    [h] = pgmsg.inbox_health(["test.inbox"])
    assert (h.status, h.dead, h.processed_last_minute) == ("degraded", 1, 1)
    assert h.reasons == ("1 dead (threshold 1)",)
    inbox_ops.discard("test.inbox", type="nope", reason="test")
    pgmsg.receive("test.inbox", "waiting", type="work", payload={})
    _age("waiting", 1, "received_at")
    [h] = pgmsg.inbox_health(["test.inbox"])
    assert (h.status, h.pending) == ("degraded", 1) and h.oldest_pending_age >= 3600
    settings.PGMSG = {**settings.PGMSG, "INBOX_DEGRADED_AGE": 7200.0}
    [h] = pgmsg.inbox_health(["test.inbox"])
    assert h.status == "healthy"
    settings.PGMSG = {**settings.PGMSG, "INBOX_DEGRADED_PENDING": 1}
    assert pgmsg.inbox_health(["test.inbox"])[0].reasons == ("1 pending (threshold 1)",)


def test_stats_per_type():
    pgmsg.receive("test.inbox", "st-1", type="work", payload={})
    pgmsg.receive("test.inbox", "st-2", type="work", payload={"fail_times": 1})
    pgmsg.receive("test.inbox", "st-3", type="nope", payload={})
    drain()
    rows = {s.type: s for s in inbox_ops.stats("test.inbox")}
    assert (rows["work"].received, rows["work"].processed, rows["work"].pending) == (2, 1, 1)
    assert (rows["nope"].received, rows["nope"].dead) == (1, 1)


def test_command_health_json_and_human_and_operations():
    pgmsg.receive("test.inbox", "cmd-1", type="nope", payload={})
    drain()
    out = StringIO()
    call_command("pgmsg_inbox", "health", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data["status"] == "degraded"
    assert data["inboxes"]["test.inbox"]["dead"] == 1
    out = StringIO()
    call_command("pgmsg_inbox", "health", stdout=out)
    assert "test.inbox" in out.getvalue() and "degraded" in out.getvalue()
    out = StringIO()
    call_command("pgmsg_inbox", "stats", "test.inbox", stdout=out)
    assert "nope" in out.getvalue()
    call_command(
        "pgmsg_inbox",
        "discard",
        "test.inbox",
        "--type",
        "nope",
        "--reason",
        "spam",
        stdout=StringIO(),
    )
    assert status_of("cmd-1").discard_reason == "spam"
    call_command("pgmsg_inbox", "purge", stdout=StringIO())


def test_json_health_endpoint_answers_200_or_503(client):
    response = client.get("/pgmsg/inbox/health/")
    assert response.status_code == 200
    assert response.json()["inboxes"]["test.ordered"]["status"] == "healthy"
    pgmsg.receive("test.inbox", "ep", type="nope", payload={})
    drain()
    response = client.get("/pgmsg/inbox/health/")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded" and body["inboxes"]["test.inbox"]["dead"] == 1
    assert client.get("/pgmsg/inbox/health/test.ordered/").status_code == 200
    assert client.get("/pgmsg/inbox/health/test.nope/").status_code == 404


@pytest.mark.parametrize("per_message", [False, True])
def test_a_failing_message_does_not_undo_the_others_of_its_batch(settings, per_message):
    settings.PGMSG = {
        **settings.PGMSG,
        "SAVEPOINT_PER_MESSAGE": per_message,
        "RETRY_BACKOFF": 30.0,
        "RETRY_BACKOFF_MAX": 60.0,
    }
    pgmsg.receive("test.inbox", "f-0", type="work", payload={})
    pgmsg.receive("test.inbox", "f-1", type="work", payload={"fail_times": 1})
    pgmsg.receive("test.inbox", "f-2", type="work", payload={})
    pgmsg.receive(
        "test.ordered", "g-0", type="step", aggregate_id="G", payload={"seq": 0, "fail_times": 1}
    )
    pgmsg.receive("test.ordered", "g-1", type="step", aggregate_id="G", payload={"seq": 1})
    pgmsg.receive("test.ordered", "h-0", type="step", aggregate_id="H", payload={"seq": 0})
    drain("test.inbox", "test.ordered")
    assert effects() == {"f-0": 1, "f-2": 1}
    assert effects("inbox:test.ordered") == {"H:0": 1}  # G:1 waits behind the failed G:0
    assert status_of("f-1").attempts == 1 and status_of("g-1", "test.ordered").attempts == 0
    make_due_now()
    drain("test.inbox", "test.ordered")
    assert effects() == {"f-0": 1, "f-1": 1, "f-2": 1}
    assert effects("inbox:test.ordered") == {"H:0": 1, "G:0": 1, "G:1": 1}


def test_command_gaps_and_replay():
    pgmsg.receive(
        "test.ordered",
        "q-0",
        type="step",
        aggregate_id="Q",
        payload={"seq": 0, "fail_unless_fixed": True},
    )
    pgmsg.receive("test.ordered", "q-1", type="step", aggregate_id="Q", payload={"seq": 1})
    for _ in range(2):
        drain("test.ordered")
        make_due_now()
    out = StringIO()
    call_command("pgmsg_inbox", "gaps", "test.ordered", "--json", stdout=out)
    [gap] = json.loads(out.getvalue())
    assert (gap["aggregate_id"], gap["status"], gap["waiting"]) == ("Q", "dead", 1)
    Effect.objects.create(key="fixed:q-0")
    call_command("pgmsg_inbox", "replay", "test.ordered", str(gap["head_id"]), stdout=StringIO())
    drain("test.ordered")
    assert effects("inbox:test.ordered") == {"Q:0": 1, "Q:1": 1}


def test_admin_replay_and_discard_need_their_own_permissions(client):
    from django.contrib.auth.models import Permission, User

    pgmsg.receive("test.inbox", "adm", type="nope", payload={})
    drain()
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_inboxmessage"))
    client.force_login(user)
    url = "/admin/pgmsg/inboxmessage/"
    page = client.get(url)
    assert page.status_code == 200
    assert b"replay_selected" not in page.content and b"discard_selected" not in page.content
    row = status_of("adm")
    refused = client.post(url, {"action": "replay_selected", "_selected_action": [row.id]})
    assert status_of("adm").status == "dead" and refused.status_code in (200, 302)
    user.user_permissions.add(Permission.objects.get(codename="discard_inboxmessage"))
    user = User.objects.get(pk=user.pk)  # drop the cached permissions
    client.force_login(user)
    assert b"discard_selected" in client.get(url).content
    client.post(url, {"action": "discard_selected", "_selected_action": [row.id]})
    row = status_of("adm")
    assert (row.status, row.discard_reason) == ("discarded", "discarded in the admin by ops")


def test_ordered_inbox_with_more_aggregates_than_a_batch_takes_drains_them_all():
    pgmsg.receive_many(
        "test.ordered",
        [
            {
                "message_id": f"many-{i}",
                "type": "step",
                "aggregate_id": f"m{i}",
                "payload": {"seq": 0},
            }
            for i in range(30)
        ],
    )
    drain("test.ordered", batch_size=4)
    assert InboxMessage.objects.filter(status="processed").count() == 30


def test_a_handler_for_an_undeclared_inbox_fails_the_system_check():
    from pgmsg.inbox import check_handlers

    assert check_handlers() == []

    @pgmsg.inbox_handler("test.typo", "work")
    def lost(message):
        pass

    try:
        [problem] = check_handlers()
        assert problem.id == "pgmsg.E401" and "'test.typo'" in problem.msg
    finally:
        del registry.handlers[("test.typo", "work")]


def test_listen_refuses_an_unknown_inbox_with_the_known_names():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=r"'test.nope'.*test.inbox"):
        call_command("listen", "--inbox", "test.nope", "--until-idle")


def test_ordered_inbox_messages_without_aggregate_are_not_starved_by_a_backlog():
    pgmsg.receive_many(
        "test.ordered",
        [
            {"message_id": f"bk-{i}", "type": "step", "aggregate_id": "big", "payload": {"seq": i}}
            for i in range(20)
        ],
    )
    pgmsg.receive("test.ordered", "loose-1", type="step", payload={"seq": 0})
    worker = Worker(inboxes=["test.ordered"], batch_size=4, install_signal_handlers=False)
    worker.sources[0].process_batch(worker)  # one batch: the aggregate fills it
    assert status_of("loose-1", "test.ordered").status == "processed"
