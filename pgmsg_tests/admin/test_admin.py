"""The admin: notifications by state, dead letters on their own list; replay and discard only
with their permissions (Notification's, on both lists)."""

import pytest
from django.contrib.auth.models import Permission, User

import pgmsg
from pgmsg.models import Notification, NotificationDeadLetter
from pgmsg_tests.helpers import drain, make_due_now
from pgmsg_tests.testapp.channels import Work

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/admin/pgmsg/notification/"
DEAD_URL = "/admin/pgmsg/notificationdeadletter/"


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
    rows = {n.payload["key"]: n for n in Notification.objects.all()}
    rows["dead"] = NotificationDeadLetter.objects.get()
    return rows


@pytest.mark.parametrize("state", ["pending", "retrying"])
def test_list_filters_by_state(client, states, state):
    client.force_login(staff())
    response = client.get(URL, {"state": state})
    assert response.status_code == 200
    shown = {n.payload["key"] for n in response.context["cl"].result_list}
    assert shown == {state}


def test_dead_letters_have_their_own_list(client, states):
    client.force_login(staff())
    response = client.get(DEAD_URL)
    assert response.status_code == 200
    assert [n.payload["key"] for n in response.context["cl"].result_list] == ["dead"]
    assert {n.payload["key"] for n in client.get(URL).context["cl"].result_list} == {
        "pending",
        "retrying",
    }


def test_detail_shows_payload_attempts_and_error(client, states):
    client.force_login(staff())
    response = client.get(f"{DEAD_URL}{states['dead'].pk}/change/")
    body = response.content.decode()
    assert response.status_code == 200
    assert "always fails" in body and "&quot;dead&quot;" in body


def test_actions_need_their_permissions(client, states):
    client.force_login(staff())
    for url in (URL, DEAD_URL):
        form = client.get(url).context.get("action_form")
        actions = dict(form.fields["action"].choices) if form else {}
        assert "replay_selected" not in actions and "discard_selected" not in actions
    response = client.post(
        DEAD_URL, {"action": "replay_selected", "_selected_action": [states["dead"].pk]}
    )
    assert NotificationDeadLetter.objects.filter(pk=states["dead"].pk).exists()
    assert response.status_code in (200, 302)


def test_replay_action_replays(client, states):
    client.force_login(staff("replay_notification"))
    response = client.post(
        DEAD_URL,
        {"action": "replay_selected", "_selected_action": [states["dead"].pk]},
        follow=True,
    )
    assert "Replayed 1 notification(s)." in response.content.decode()
    row = Notification.objects.get(pk=states["dead"].pk)  # back, with its id
    assert row.state == "pending" and row.attempts == 0
    assert not NotificationDeadLetter.objects.exists()


def test_replay_action_replays_a_retrying_one_now(client, states):
    client.force_login(staff("replay_notification"))
    retrying = states["retrying"]
    client.post(URL, {"action": "replay_selected", "_selected_action": [retrying.pk]})
    retrying.refresh_from_db()
    assert retrying.attempts == 0 and retrying.available_at <= retrying.created_at.now(
        tz=retrying.created_at.tzinfo
    )


def test_discard_action_discards_dead_letters(client, states):
    client.force_login(staff("discard_notification"))
    response = client.post(
        DEAD_URL,
        {"action": "discard_selected", "_selected_action": [states["dead"].pk]},
        follow=True,
    )
    assert "Discarded 1 notification(s)." in response.content.decode()
    assert not NotificationDeadLetter.objects.exists()
    assert set(Notification.objects.values_list("pk", flat=True)) == {
        states["pending"].pk,
        states["retrying"].pk,
    }
    # The pending list offers no discard: nothing on it is dead.
    form = client.get(URL).context.get("action_form")
    assert "discard_selected" not in dict(form.fields["action"].choices if form else [])
