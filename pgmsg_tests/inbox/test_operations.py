"""Operating inboxes: replay, discard, retention, health, stats, gaps, commands, admin, checks."""

import json
from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

import pgmsg
from pgmsg.inbox import operations as inbox_ops
from pgmsg.inbox.declarations import registry
from pgmsg.models import InboxMessage
from pgmsg_tests.inbox.helpers import drain, effects, make_due_now, status_of
from pgmsg_tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


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
    with pytest.raises(CommandError, match="degraded: .*test.inbox") as failed:
        call_command("pgmsg_inbox", "health", "--json", stdout=out)
    assert failed.value.returncode == 1  # a monitor sees failure, as the endpoint's 503
    data = json.loads(out.getvalue())
    assert data["status"] == "degraded"
    assert data["inboxes"]["test.inbox"]["dead"] == 1
    for verb in ("health", "status"):
        out = StringIO()
        with pytest.raises(CommandError, match="degraded"):
            call_command("pgmsg_inbox", verb, stdout=out)
        assert "test.inbox" in out.getvalue() and "degraded" in out.getvalue()
    out = StringIO()
    call_command("pgmsg_inbox", "list", "test.inbox", stdout=out)
    assert "\tcmd-1\tnope\tdead\t" in out.getvalue()
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
    user = User.objects.create_user("monitor", password="pw")
    user.user_permissions.set(Permission.objects.filter(codename="view_overview"))
    client.force_login(user)  # names and counts need pgmsg.view_overview
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


def test_a_handler_for_an_undeclared_inbox_fails_the_system_check():
    from pgmsg.inbox.declarations import check_handlers

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
