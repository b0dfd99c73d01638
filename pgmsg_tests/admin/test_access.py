"""Who sees what in the admin overview: its own permission shows counts; a dead letter's
payload and error need its model's view permission; a refused operation is an admin message;
outboxes, and inboxes the web process does not declare, are counted from the tables."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection

import pgmsg
from pgmsg.inbox.declarations import registry as inbox_registry
from pgmsg.models import InboxMessage, NotificationDeadLetter, OutboxMessage
from pgmsg.outbox.declarations import registry as outbox_registry
from pgmsg_tests.helpers import dead_letter

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "card-4242-4242-secret"
OVERVIEW = "/admin/pgmsg/overview/"


def staff(*codenames: str) -> User:
    user = User.objects.create_user(f"u{User.objects.count()}", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


def dead_inbox_message(inbox: str, message_id: str) -> InboxMessage:
    """A dead inbox message as a worker leaves one (this process may declare no such inbox)."""
    pgmsg.receive(inbox, message_id, type="charge", payload={"card": SECRET})
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgmsg_inbox_message SET status = 'dead', attempts = 3, "
            "last_error = %s, last_failed_at = now() WHERE inbox = %s AND message_id = %s",
            [f"Traceback ...\nValueError: declined {SECRET}", inbox, message_id],
        )
    return InboxMessage.objects.get(inbox=inbox, message_id=message_id)


def dead_outbox_message() -> OutboxMessage:
    pgmsg.publish("test.recorded", {"card": SECRET}, type="charge", key="k")
    OutboxMessage.objects.filter(outbox="test.recorded").update(
        status="dead", attempts=3, last_error=f"Traceback ...\nValueError: refused {SECRET}"
    )
    return OutboxMessage.objects.get(outbox="test.recorded")


@pytest.fixture
def dead():
    """A dead notification, inbox message and outbox message, each with the secret in its
    payload and its error."""
    return {
        "channel": dead_letter(
            channel="test.work",
            payload={"key": SECRET},
            last_error=f"Traceback ...\nRuntimeError: work {SECRET} always fails",
        ),
        "inbox": dead_inbox_message("test.inbox", "charge-1"),
        "outbox": dead_outbox_message(),
    }


SOURCES = {
    "channel": ("test.work", "view_notification"),
    "inbox": ("test.inbox", "view_inboxmessage"),
    "outbox": ("test.recorded", "view_outboxmessage"),
}


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_the_overview_permission_shows_counts_but_no_payload_or_error(client, dead, kind):
    name, _ = SOURCES[kind]
    row = dead[kind]
    client.force_login(staff("view_overview"))
    listing = client.get(f"{OVERVIEW}dead/{kind}/{name}/")
    assert listing.status_code == 200
    body = listing.content.decode()
    assert "1 dead letter" in body and SECRET not in body
    assert f"/{row.pk}/" not in body  # not even the ids
    detail = client.get(f"{OVERVIEW}dead/{kind}/{name}/{row.pk}/", follow=True)
    body = detail.content.decode()
    assert SECRET not in body
    assert "needs the permission pgmsg.view_" in body  # the admin's message, on the list


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_the_models_view_permission_shows_payload_and_error(client, dead, kind):
    name, codename = SOURCES[kind]
    row = dead[kind]
    client.force_login(staff("view_overview", codename))
    listing = client.get(f"{OVERVIEW}dead/{kind}/{name}/").content.decode()
    assert f"/{row.pk}/" in listing and SECRET in listing  # the error's last line
    detail = client.get(f"{OVERVIEW}dead/{kind}/{name}/{row.pk}/")
    assert detail.status_code == 200
    body = detail.content.decode()
    assert body.count(SECRET) >= 2  # the payload and the error


def test_another_models_view_permission_does_not_open_a_kind(client, dead):
    client.force_login(staff("view_overview", "view_inboxmessage"))
    row = dead["channel"]
    response = client.get(f"{OVERVIEW}dead/channel/test.work/{row.pk}/", follow=True)
    assert SECRET not in response.content.decode()


@pytest.mark.parametrize(
    ("action", "permission"),
    [("replay", "pgmsg.replay_notification"), ("discard", "pgmsg.discard_notification")],
)
def test_a_refused_operation_is_the_admins_message(client, dead, action, permission):
    row = dead["channel"]
    client.force_login(staff("view_overview", "view_notification"))
    url = f"{OVERVIEW}dead/channel/test.work/{row.pk}/"
    response = client.post(url, {"action": action, "reason": "x"}, follow=True)
    assert response.status_code == 200
    assert response.redirect_chain == [(url, 302)]
    shown = [str(m) for m in response.context["messages"]]
    assert any(permission in m and "was not" in m for m in shown), shown
    assert NotificationDeadLetter.objects.filter(pk=row.pk).exists()  # still dead


def test_an_unknown_operation_is_a_message_too(client, dead):
    row = dead["channel"]
    client.force_login(staff("view_overview", "view_notification"))
    url = f"{OVERVIEW}dead/channel/test.work/{row.pk}/"
    response = client.post(url, {"action": "explode"}, follow=True)
    assert [str(m) for m in response.context["messages"]] == ["Unknown action 'explode'."]


def test_outbox_dead_letters_replay_and_discard_with_their_permissions(client, dead):
    row = dead["outbox"]
    client.force_login(staff("view_overview", "view_outboxmessage", "replay_outboxmessage"))
    url = f"{OVERVIEW}dead/outbox/test.recorded/{row.pk}/"
    response = client.post(url, {"action": "replay"}, follow=True)
    assert f"Replayed #{row.pk}" in response.content.decode()
    row.refresh_from_db()
    assert (row.status, row.attempts) == ("pending", 0)


def test_the_overview_has_a_row_per_outbox(client, dead):
    client.force_login(staff("view_overview"))
    rows = {(r.kind, r.name): r for r in client.get(OVERVIEW).context["rows"]}
    recorded = rows["outbox", "test.recorded"]
    assert (recorded.backlog, recorded.dead) == (0, 1)
    for name in outbox_registry.outboxes:  # declared ones, even empty
        assert ("outbox", name) in rows
    pgmsg.publish("test.recorded", {"n": 1}, type="t", key="k2")
    page = client.get(OVERVIEW)
    recorded = {(r.kind, r.name): r for r in page.context["rows"]}["outbox", "test.recorded"]
    assert (recorded.backlog, recorded.dead) == (1, 1)
    assert recorded.oldest_pending_age >= 0
    assert f"{OVERVIEW}dead/outbox/test.recorded/" in page.content.decode()


def test_an_inbox_this_process_does_not_declare_shows_its_dead_letters(client, monkeypatch):
    dead_inbox_message("test.webhooks", "g-1")
    dead_inbox_message("test.webhooks", "g-2")
    pgmsg.receive("test.webhooks", "g-3", type="charge", payload={})  # waiting
    # A web process that loads no inbox module: only the workers declare it.
    monkeypatch.delitem(inbox_registry.inboxes, "test.webhooks")
    client.force_login(staff("view_overview", "view_inboxmessage"))
    rows = {(r.kind, r.name): r for r in client.get(OVERVIEW).context["rows"]}
    gone = rows["inbox", "test.webhooks"]
    assert (gone.backlog, gone.dead) == (1, 2)
    listing = client.get(f"{OVERVIEW}dead/inbox/test.webhooks/").content.decode()
    assert "2 dead letters" in listing and "g-1" in listing and "g-2" in listing


def test_the_overview_has_no_add_change_or_delete_permission():
    codenames = set(
        Permission.objects.filter(content_type__model="overview").values_list("codename", flat=True)
    )
    assert codenames == {"view_overview"}
