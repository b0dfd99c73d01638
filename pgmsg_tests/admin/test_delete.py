"""No pgmsg admin deletes anything: rows leave only through pgmsg's permissioned operations.

Checked for every admin registered for a pgmsg model, through the test client, with a staff
user holding view and delete permissions on every pgmsg model (but no discard, replay or
operate permission) and with a superuser.
"""

import uuid

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from pgmsg import models as m

pytestmark = pytest.mark.django_db

#: One row each admin lists, built the way pgmsg stores it (dead rows for dead-letter lists).
ROWS = {
    m.Notification: lambda: m.Notification.objects.create(channel="work", payload={"key": "p"}),
    m.NotificationDeadLetter: lambda: m.NotificationDeadLetter.objects.create(
        id=10**9,
        channel="work",
        payload={"key": "d"},
        attempts=5,
        created_at=timezone.now(),
        last_error="boom",
    ),
    m.InboxMessage: lambda: m.InboxMessage.objects.create(
        inbox="orders", message_id="m-pending", type="t", payload={}
    ),
    m.InboxDeadLetter: lambda: m.InboxMessage.objects.create(
        inbox="orders", message_id="m-dead", type="t", payload={}, status="dead", attempts=5
    ),
    m.StoredEvent: lambda: m.StoredEvent.objects.create(
        stream_name="account-1",
        category="account",
        version=1,
        type="account.opened",
        data={},
        message_id=uuid.uuid4(),
    ),
    m.OutboxMessage: lambda: m.OutboxMessage.objects.create(
        outbox="o", message_id="m1", destination="d", topic="t", type="x", payload={}
    ),
    m.SubscriptionPartition: lambda: m.SubscriptionPartition.objects.create(
        subscription="ledger", partition=0
    ),
}


def pgmsg_admins():
    return sorted(
        (model for model in admin.site._registry if model._meta.app_label == "pgmsg"),
        key=lambda model: model.__name__,
    )


#: Admins that are pages over other tables, not lists of rows (checked below on their own).
PAGES = {m.Overview}


def test_every_pgmsg_admin_is_covered_here():
    assert set(pgmsg_admins()) == set(ROWS) | PAGES


def test_the_overview_page_offers_no_delete(client):
    row = m.Throughput.objects.create(
        minute=timezone.now(), kind="channel", source="work", pid=1, handled=3
    )
    client.force_login(User.objects.create_superuser("root", password="pw"))
    page = client.get("/admin/pgmsg/overview/")
    assert page.status_code == 200 and b"delete_selected" not in page.content
    client.post("/admin/pgmsg/overview/", {"action": "delete_selected", "_selected_action": [1]})
    assert client.get(f"/admin/pgmsg/overview/{row.pk}/delete/").status_code == 404
    assert m.Throughput.objects.filter(pk=row.pk).exists()


def viewer_with_delete() -> User:
    user = User.objects.create_user("deleter", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="pgmsg", codename__regex=r"^(view|delete)_"
        )
    )
    return user


@pytest.fixture(params=["staff with view+delete", "superuser"])
def user(request):
    if request.param == "superuser":
        return User.objects.create_superuser("root", password="pw")
    return viewer_with_delete()


@pytest.mark.parametrize(
    "model", [a for a in pgmsg_admins() if a not in PAGES], ids=lambda model: model.__name__
)
def test_admin_offers_no_delete(client, user, model):
    row = ROWS[model]()
    client.force_login(user)
    url = f"/admin/pgmsg/{model._meta.model_name}/"

    listing = client.get(url)
    assert listing.status_code == 200
    assert row.pk in [obj.pk for obj in listing.context["cl"].result_list]
    form = listing.context.get("action_form")
    offered = dict(form.fields["action"].choices) if form else {}
    assert "delete_selected" not in offered

    client.post(url, {"action": "delete_selected", "_selected_action": [row.pk], "post": "yes"})
    assert client.get(f"{url}{row.pk}/delete/").status_code == 403
    assert client.post(f"{url}{row.pk}/delete/", {"post": "yes"}).status_code == 403
    assert model._meta.concrete_model.objects.filter(pk=row.pk).exists()
