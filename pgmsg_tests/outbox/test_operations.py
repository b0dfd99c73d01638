"""Operating the outbox: the admin (replay and discard behind their own permissions), the
system checks, and listen's --outbox."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

import pgmsg
from pgmsg.outbox import checks, destinations
from pgmsg_tests.outbox.helpers import make_due_now, relay, rows

URL = "/admin/pgmsg/outboxmessage/"


def staff(*perms: str) -> User:
    user = User.objects.create_user(f"u{User.objects.count()}", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["view_outboxmessage", *perms])
    )
    return user


@pytest.fixture
def dead():
    pgmsg.publish("test.recorded", {"refuse": 99}, type="t", key="k")
    for _ in range(3):
        relay("test.recorded")
        make_due_now("test.recorded")
    return rows("test.recorded").get()


@pytest.mark.django_db(transaction=True)
def test_the_admin_lists_dead_letters_with_the_error(client, dead):
    client.force_login(staff())
    response = client.get(URL, {"state": "dead"})
    assert [m.pk for m in response.context["cl"].result_list] == [dead.pk]
    body = client.get(f"{URL}{dead.pk}/change/").content.decode()
    assert "recorder refuses" in body


@pytest.mark.django_db(transaction=True)
def test_admin_actions_need_their_own_permissions(client, dead):
    client.force_login(staff())
    form = client.get(URL).context.get("action_form")
    actions = dict(form.fields["action"].choices) if form else {}
    assert "replay_selected" not in actions and "discard_selected" not in actions
    client.post(URL, {"action": "discard_selected", "_selected_action": [dead.pk]})
    assert rows("test.recorded").filter(pk=dead.pk, status="dead").exists()

    client.force_login(staff("replay_outboxmessage"))
    response = client.post(
        URL, {"action": "replay_selected", "_selected_action": [dead.pk]}, follow=True
    )
    assert "Replayed 1 message(s)." in response.content.decode()
    assert rows("test.recorded").get().status == "pending"

    client.force_login(staff("discard_outboxmessage"))
    response = client.post(
        URL, {"action": "discard_selected", "_selected_action": [dead.pk]}, follow=True
    )
    assert "Discarded 1 message(s)." in response.content.decode()
    assert not rows("test.recorded").exists()


def test_configured_destinations_pass_the_checks():
    assert checks.check_destinations() == []


@pytest.mark.parametrize(
    "value, complaint",
    [
        ("kafka://127.0.0.1:9092", "has scheme 'kafka'"),
        ("amqp://127.0.0.1/?mandatory=maybe", "mandatory must be 1 or 0"),
        ("nats://127.0.0.1:4222?timeout=-1", "timeout must be a positive number"),
        ("redis://127.0.0.1:6379/0?maxlen=x", "maxlen must be a positive int"),
        ("no.such.module.func", "cannot import the callable"),
        (42, "must be a URL or a dotted path"),
    ],
)
def test_a_destination_that_cannot_be_used_is_a_check_error(settings, value, complaint):
    pgmsg_settings = {**settings.PGMSG}
    pgmsg_settings["OUTBOX_DESTINATIONS"] = {**pgmsg_settings["OUTBOX_DESTINATIONS"], "x": value}
    with override_settings(PGMSG=pgmsg_settings):
        problems = checks.check_destinations()
    assert [p.id for p in problems] == ["pgmsg.E501"]
    assert complaint in problems[0].msg
    assert "guest" not in problems[0].msg or "***" in problems[0].msg


def test_an_outbox_whose_destination_is_not_configured_is_a_check_error(settings):
    pgmsg_settings = {**settings.PGMSG, "OUTBOX_DESTINATIONS": {}}
    with override_settings(PGMSG=pgmsg_settings):
        problems = checks.check_destinations()
    assert {p.id for p in problems} == {"pgmsg.E502"}
    assert any("outbox 'test.rabbit'" in p.msg for p in problems)


def test_passwords_are_hidden_in_messages():
    with pytest.raises(pgmsg.errors.UnknownDestination) as caught:
        destinations.make("x", "amqp://guest:secret@127.0.0.1/?mandatory=maybe")
    assert "secret" not in str(caught.value) and "***" in str(caught.value)


def test_listen_refuses_an_unknown_outbox():
    with pytest.raises(CommandError, match="no outbox named 'test.nope'"):
        call_command("listen", "--outbox", "test.nope")
