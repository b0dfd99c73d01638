"""pgmsg.urls' endpoints: anyone learns the status; names, counts and metrics need a user with
pgmsg.view_overview or the PGMSG ENDPOINT_TOKEN as a bearer token."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

import pgmsg
from pgmsg_tests.inbox.helpers import drain as drain_inbox
from pgmsg_tests.testapp.channels import Work

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "a-token-of-forty-characters-0123456789ab"
HEALTH, METRICS = "/pgmsg/inbox/health/", "/pgmsg/metrics/"


@pytest.fixture
def token(settings):
    settings.PGMSG = {**settings.PGMSG, "ENDPOINT_TOKEN": TOKEN}


@pytest.fixture
def degraded():
    """A dead inbox message (test.inbox degraded) and a waiting notification."""
    pgmsg.receive("test.inbox", "ep", type="nope", payload={})
    drain_inbox()
    pgmsg.notify(Work(key="waiting"))


def login(client, *codenames: str) -> None:
    user = User.objects.create_user(f"u{User.objects.count()}", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client.force_login(user)


def test_anonymous_health_is_the_status_only(client, degraded):
    response = client.get(HEALTH)
    assert (response.status_code, response.json()) == (503, {"status": "degraded"})
    one = client.get(f"{HEALTH}test.ordered/")
    assert (one.status_code, one.json()) == (200, {"status": "healthy"})


def test_anonymous_metrics_are_refused_without_a_name(client, degraded):
    response = client.get(METRICS)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"test." not in response.content


def test_a_user_without_the_permission_gets_the_status_and_403(client, degraded):
    login(client, "view_notification")
    assert client.get(HEALTH).json() == {"status": "degraded"}
    response = client.get(METRICS)
    assert response.status_code == 403 and b"test." not in response.content


def test_a_user_with_the_overview_permission_reads_names_counts_and_metrics(client, degraded):
    login(client, "view_overview")
    body = client.get(HEALTH).json()
    assert body["status"] == "degraded" and body["inboxes"]["test.inbox"]["dead"] == 1
    response = client.get(METRICS)
    assert response.status_code == 200
    assert b'pgmsg_backlog{kind="channel",source="test.work"} 1.0' in response.content


def test_the_bearer_token_reads_names_counts_and_metrics(client, token, degraded):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    assert client.get(HEALTH, **auth).json()["inboxes"]["test.inbox"]["dead"] == 1
    response = client.get(METRICS, **auth)
    assert response.status_code == 200 and b'source="test.work"' in response.content


@pytest.mark.parametrize(
    "header",
    [f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN}x", "Bearer ", f"Basic {TOKEN}", TOKEN],
)
def test_a_wrong_token_gets_the_status_only(client, token, degraded, header):
    assert client.get(HEALTH, HTTP_AUTHORIZATION=header).json() == {"status": "degraded"}
    assert client.get(METRICS, HTTP_AUTHORIZATION=header).status_code == 401


def test_without_a_token_setting_no_bearer_token_opens_them(client, degraded):
    # The default ENDPOINT_TOKEN is empty: an empty bearer token must not match it.
    for header in ("Bearer ", "Bearer", "bearer  "):
        assert client.get(METRICS, HTTP_AUTHORIZATION=header).status_code == 401
