"""The admin: notifications by state; replay and discard only with their permissions."""

import pytest
from django.contrib.auth.models import Permission, User

import pgmsg
from pgmsg.models import Notification
from pgmsg_tests.helpers import drain, make_due_now
from pgmsg_tests.testapp.channels import Work

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/admin/pgmsg/notification/"


def staff(*perms: str) -> User:
    user = User.objects.create_user(f"u{User.objects.count()}", password="pw", is_staff=True)
    codenames = ["view_notification", *perms]
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


@pytest.fixture
def states():
    """One pending, one retrying and one dead notification."""
    pgmsg.notify(Work(key="dead", always_fail=True))
    for _ in range(5):
        drain()
        make_due_now()
    pgmsg.notify(Work(key="retrying", always_fail=True))
    drain()
    pgmsg.notify(Work(key="pending"))
    return {n.payload["key"]: n for n in Notification.objects.all()}


@pytest.mark.parametrize("state", ["pending", "retrying", "dead"])
def test_list_filters_by_state(client, states, state):
    client.force_login(staff())
    response = client.get(URL, {"state": state})
    assert response.status_code == 200
    shown = {n.payload["key"] for n in response.context["cl"].result_list}
    assert shown == {state}


def test_detail_shows_payload_attempts_and_error(client, states):
    client.force_login(staff())
    response = client.get(f"{URL}{states['dead'].pk}/change/")
    body = response.content.decode()
    assert response.status_code == 200
    assert "always fails" in body and "&quot;dead&quot;" in body


def test_actions_need_their_permissions(client, states):
    client.force_login(staff())
    form = client.get(URL).context.get("action_form")
    actions = dict(form.fields["action"].choices) if form else {}
    assert "replay_selected" not in actions and "discard_selected" not in actions
    response = client.post(
        URL, {"action": "replay_selected", "_selected_action": [states["dead"].pk]}
    )
    assert Notification.objects.get(pk=states["dead"].pk).status == "dead"
    assert response.status_code in (200, 302)


def test_replay_action_replays(client, states):
    client.force_login(staff("replay_notification"))
    response = client.post(
        URL, {"action": "replay_selected", "_selected_action": [states["dead"].pk]}, follow=True
    )
    assert "Replayed 1 notification(s)." in response.content.decode()
    row = Notification.objects.get(pk=states["dead"].pk)
    assert row.status == "pending" and row.attempts == 0


def test_discard_action_discards_dead_only(client, states):
    client.force_login(staff("discard_notification"))
    selected = [states["dead"].pk, states["pending"].pk]
    response = client.post(
        URL, {"action": "discard_selected", "_selected_action": selected}, follow=True
    )
    assert "Discarded 1 notification(s) (1 not dead, left alone)." in response.content.decode()
    assert set(Notification.objects.values_list("pk", flat=True)) == {
        states["pending"].pk,
        states["retrying"].pk,
    }
