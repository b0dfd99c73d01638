"""The admin's "Dead letters" entries: dead rows only, tracebacks intact, the same actions."""

import pytest
from django.contrib.auth.models import Permission, User

from pgmsg.models import InboxMessage, Notification, NotificationDeadLetter
from pgmsg_tests.helpers import dead_letter

pytestmark = pytest.mark.django_db

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "shop/listeners.py", line 12, in ship\n'
    "    raise ValueError('no address')\n"
    "ValueError: no address"
)


def staff(*codenames: str) -> User:
    user = User.objects.create_user(f"u{User.objects.count()}", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


@pytest.fixture
def rows():
    return {
        "dead": dead_letter(channel="work", payload={}, last_error=TRACEBACK),
        "pending": Notification.objects.create(channel="work", payload={}),
        "inbox_dead": InboxMessage.objects.create(
            inbox="orders", message_id="a", type="t", payload={}, status="dead", attempts=5
        ),
        "inbox_pending": InboxMessage.objects.create(
            inbox="orders", message_id="b", type="t", payload={}
        ),
    }


def test_the_index_has_a_dead_letters_entry(client, rows):
    client.force_login(staff("view_notification", "view_inboxmessage"))
    body = client.get("/admin/").content.decode()
    assert "Dead letters (channels)" in body and "Dead letters (inboxes)" in body


@pytest.mark.parametrize(
    "url, view, dead, alive",
    [
        ("/admin/pgmsg/notificationdeadletter/", "view_notification", "dead", "pending"),
        ("/admin/pgmsg/inboxdeadletter/", "view_inboxmessage", "inbox_dead", "inbox_pending"),
    ],
)
def test_lists_only_dead_letters(client, rows, url, view, dead, alive):
    client.force_login(staff(view))
    shown = [obj.pk for obj in client.get(url).context["cl"].result_list]
    assert shown == [rows[dead].pk]


def test_detail_keeps_the_traceback_indentation(client, rows):
    client.force_login(staff("view_notification"))
    body = client.get(f"/admin/pgmsg/notificationdeadletter/{rows['dead'].pk}/change/")
    html = body.content.decode()
    assert "<pre" in html
    assert "\n    raise ValueError(&#x27;no address&#x27;)\n" in html


def test_replay_uses_the_channels_replay_permission(client, rows):
    url = "/admin/pgmsg/notificationdeadletter/"
    client.force_login(staff("view_notification"))
    client.post(url, {"action": "replay_selected", "_selected_action": [rows["dead"].pk]})
    assert NotificationDeadLetter.objects.filter(pk=rows["dead"].pk).exists()

    client.force_login(staff("view_notification", "replay_notification"))
    client.post(url, {"action": "replay_selected", "_selected_action": [rows["dead"].pk]})
    assert not NotificationDeadLetter.objects.filter(pk=rows["dead"].pk).exists()
    assert Notification.objects.get(pk=rows["dead"].pk).attempts == 0
