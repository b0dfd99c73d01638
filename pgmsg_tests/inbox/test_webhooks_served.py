"""The webhook receiver behind a real gunicorn: what a sender sees over the wire, and that a
200 comes only once the message is committed (this test's own connection sees it then)."""

from __future__ import annotations

import http.client
import json
import time

import pytest

from pgmsg.core import signatures
from pgmsg.models import InboxMessage
from pgmsg_tests.conftest import WorkerProcesses
from pgmsg_tests.served import Gunicorn, free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

SECRET = "served-secret"
HOOKS = {
    "pgmsg": {"inbox": "test.inbox", "secret": SECRET, "max_body": 4096},
    "stripe": {"inbox": "test.inbox", "secret": SECRET, "format": "stripe"},
    "github": {"inbox": "test.inbox", "secret": SECRET, "format": "github"},
}


@pytest.fixture(scope="module")
def served(tmp_path_factory, django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        env = WorkerProcesses(tmp_path_factory.mktemp("served")).env()
    env["PGMSG_TEST_SETTINGS"] = json.dumps({"WEBHOOKS": HOOKS})
    server = Gunicorn("pgmsg_tests.wsgi", env, tmp_path_factory.mktemp("log") / "gunicorn.log")
    server.start()
    yield server
    server.kill()


def post(server: Gunicorn, name: str, body: bytes, headers: dict[str, str]):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request(
            "POST",
            f"/pgmsg/webhooks/{name}/",
            body=body,
            headers={"content-type": "application/json", **headers},
        )
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read() or b"{}")
    finally:
        connection.close()


def signed(body: bytes, message_id: str, *, timestamp: int | None = None, secret: str = SECRET):
    return {
        **signatures.sign(secret, body, timestamp=timestamp),
        "pgmsg-message-id": message_id,
        "pgmsg-type": "work",
    }


def ids() -> list[str]:
    return list(InboxMessage.objects.order_by("id").values_list("message_id", flat=True))


def test_a_200_means_committed_and_a_duplicate_is_200_and_stored_once(served):
    body = b'{"n": 1}'
    assert post(served, "pgmsg", body, signed(body, "m-1")) == (
        200,
        {"stored": True, "message_id": "m-1"},
    )
    assert ids() == ["m-1"]  # another process's connection: committed before the answer
    status, answer = post(served, "pgmsg", body, signed(body, "m-1"))
    assert (status, answer["stored"]) == (200, False)
    assert ids() == ["m-1"]


def test_bad_and_stale_signatures_are_401_and_store_nothing(served):
    body = b'{"n": 1}'
    assert post(served, "pgmsg", body, signed(body, "m-2", secret="wrong"))[0] == 401
    stale = signed(body, "m-3", timestamp=int(time.time()) - 600)
    assert post(served, "pgmsg", body, stale)[0] == 401
    assert post(served, "pgmsg", body, {"pgmsg-message-id": "m-4", "pgmsg-type": "w"})[0] == 401
    assert ids() == []


def test_an_oversized_body_is_413_unread_and_stores_nothing(served):
    body = json.dumps({"pad": "x" * 1_000_000}).encode()
    assert post(served, "pgmsg", body, signed(body, "m-5"))[0] == 413
    assert ids() == []


def test_stripe_and_github_styles(served):
    body = json.dumps({"id": "evt_1", "type": "work"}).encode()
    now = int(time.time())
    mac = signatures.digest(SECRET, f"{now}.".encode() + body)
    assert post(served, "stripe", body, {"Stripe-Signature": f"t={now},v1={mac}"})[0] == 200
    body = b'{"action": "opened"}'
    headers = {
        "X-Hub-Signature-256": "sha256=" + signatures.digest(SECRET, body),
        "X-GitHub-Delivery": "d-1",
        "X-GitHub-Event": "work",
    }
    assert post(served, "github", body, headers)[0] == 200
    assert ids() == ["evt_1", "d-1"]


def test_a_database_that_cannot_be_reached_is_503_so_the_sender_tries_again(tmp_path):
    env = {
        "DATABASE_URL": f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere",
        "DJANGO_SETTINGS_MODULE": "pgmsg_tests.settings",
        "PGMSG_TEST_SETTINGS": json.dumps({"WEBHOOKS": HOOKS}),
    }
    server = Gunicorn("pgmsg_tests.wsgi", env, tmp_path / "gunicorn.log", workers=1).start()
    try:
        body = b'{"n": 1}'
        assert post(server, "pgmsg", body, signed(body, "m-9")) == (
            503,
            {"error": "not stored; try again"},
        )
    finally:
        server.kill()
