"""The inbox's webhook receiver through Django's test client: signatures of each style, the
answers (200, 401, 413, 400, 404, 405), and what is stored (once, or nothing)."""

from __future__ import annotations

import json
import time

import pytest
from django.core import checks
from django.test import override_settings

from pgmsg.core import conf, signatures
from pgmsg.models import InboxMessage

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "inbox-test-secret"
HOOKS = {
    "pgmsg": {"inbox": "test.inbox", "secret": SECRET, "max_body": 200_000},
    "stripe": {
        "inbox": "test.inbox",
        "secrets": ["old", SECRET],
        "format": "stripe",
        "aggregate_id": "body:data.object.customer",
    },
    "github": {
        "inbox": "test.inbox",
        "secret": SECRET,
        "format": "github",
        "aggregate_id": "body:repository.full_name",
    },
    "custom": {
        "inbox": "test.ordered",
        "secret": SECRET,
        "signature_header": "X-Sig",
        "timestamp_header": "X-Time",
        "message_id": ["header:X-Id", "body:id"],
        "type": "body:kind",
        "aggregate_id": "body:order",
        "trace_id": "header:X-Trace",
        "source": "shop",
    },
}


@pytest.fixture(autouse=True)
def webhooks():
    with override_settings(PGMSG={**conf.get().__dict__, "WEBHOOKS": HOOKS}):
        yield


def stored():
    return list(InboxMessage.objects.order_by("id"))


def post(client, name: str, body: bytes, headers: dict[str, str]):
    return client.post(
        f"/pgmsg/webhooks/{name}/", body, content_type="application/json", headers=headers
    )


def pgmsg_headers(body: bytes, *, secret: str = SECRET, timestamp: int | None = None, **extra):
    return {
        **signatures.sign(secret, body, timestamp=timestamp),
        "pgmsg-message-id": "m-1",
        "pgmsg-type": "work",
        "pgmsg-key": "order-7",
        **extra,
    }


def test_a_signed_message_is_stored_and_answered_200_and_a_duplicate_200_once(client):
    body = b'{"n": 1}'
    first = post(client, "pgmsg", body, pgmsg_headers(body, traceparent="00-ab-cd-01"))
    assert first.status_code == 200
    assert first.json() == {"stored": True, "message_id": "m-1"}
    again = post(client, "pgmsg", body, pgmsg_headers(body))
    assert again.status_code == 200 and again.json()["stored"] is False
    (row,) = stored()
    assert (row.inbox, row.message_id, row.type, row.aggregate_id) == (
        "test.inbox",
        "m-1",
        "work",
        "order-7",
    )
    assert row.payload == {"n": 1} and row.source == "webhook:pgmsg"
    assert row.trace_id == "00-ab-cd-01"


@pytest.mark.parametrize(
    "headers",
    [
        {},  # no signature
        {"secret": "wrong"},
        {"skew": -310},  # stale
        {"skew": 310},  # from the future
    ],
    ids=["missing", "wrong-secret", "stale", "future"],
)
def test_a_bad_signature_is_401_and_stores_nothing(client, headers):
    body = b'{"n": 1}'
    if "skew" in headers:
        sent = pgmsg_headers(body, timestamp=int(time.time()) + headers["skew"])
    elif headers:
        sent = pgmsg_headers(body, **headers)
    else:
        sent = {"pgmsg-message-id": "m-1", "pgmsg-type": "work"}
    answer = post(client, "pgmsg", body, sent)
    assert answer.status_code == 401
    assert answer.json() == {"error": "invalid signature"}  # the reason is logged, not told
    assert stored() == []


def test_a_signature_over_another_body_is_401(client):
    answer = post(client, "pgmsg", b'{"n": 2}', pgmsg_headers(b'{"n": 1}'))
    assert answer.status_code == 401 and stored() == []


def test_an_oversized_body_is_413_and_stores_nothing(client):
    body = json.dumps({"pad": "x" * 200_000}).encode()
    answer = post(client, "pgmsg", body, pgmsg_headers(body))
    assert answer.status_code == 413 and "200000 bytes" in answer.json()["error"]
    assert stored() == []


@pytest.mark.parametrize(
    "body, drop, reason",
    [
        (b"{not json", None, "not JSON"),
        (b"\xff\xfe", None, "not JSON"),
        (b"[" * 100_000, None, "not JSON"),  # nested past Python's recursion limit
        (b'{"n": 1}', "pgmsg-message-id", "no message_id (looked in header:pgmsg-message-id)"),
        (b'{"n": 1}', "pgmsg-type", "no type"),
        # JSON that PostgreSQL's jsonb refuses: the sender's to mend, not to send again.
        (b'{"n": NaN}', None, "not JSON-serialisable"),
        (b'{"n": "a\\u0000b"}', None, "PostgreSQL refuses the message"),
    ],
)
def test_a_signed_body_that_is_not_json_or_lacks_an_id_is_400_with_the_reason(
    client, body, drop, reason
):
    headers = pgmsg_headers(body)
    headers.pop(drop, None)
    answer = post(client, "pgmsg", body, headers)
    assert answer.status_code == 400 and reason in answer.json()["error"]
    assert stored() == []


def test_an_unknown_type_is_stored_for_the_inbox_to_dead_letter(client):
    body = b'{"n": 1}'
    answer = post(client, "pgmsg", body, pgmsg_headers(body, **{"pgmsg-type": "nobody.handles"}))
    assert answer.status_code == 200
    assert [r.type for r in stored()] == ["nobody.handles"]


def test_stripe_style(client):
    body = json.dumps(
        {"id": "evt_1", "type": "work", "data": {"object": {"customer": "cus_9"}}}
    ).encode()
    now = int(time.time())
    mac = signatures.digest(SECRET, f"{now}.".encode() + body)
    answer = post(client, "stripe", body, {"Stripe-Signature": f"t={now},v1={mac}"})
    assert answer.status_code == 200, answer.content
    (row,) = stored()
    assert (row.message_id, row.type, row.aggregate_id) == ("evt_1", "work", "cus_9")
    stale = {"Stripe-Signature": f"t={now - 400},v1={mac}"}
    assert post(client, "stripe", body, stale).status_code == 401


def test_github_style(client):
    body = json.dumps({"action": "opened", "repository": {"full_name": "a/b"}}).encode()
    headers = {
        "X-Hub-Signature-256": "sha256=" + signatures.digest(SECRET, body),
        "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "X-GitHub-Event": "work",
    }
    assert post(client, "github", body, headers).status_code == 200
    (row,) = stored()
    assert (row.message_id, row.type, row.aggregate_id) == (
        "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "work",
        "a/b",
    )
    bad = {**headers, "X-Hub-Signature-256": "sha256=" + signatures.digest("other", body)}
    assert post(client, "github", body, bad).status_code == 401


def test_header_names_and_field_sources_are_configurable(client):
    body = json.dumps({"id": 42, "kind": "tick", "order": 7}).encode()
    signed = signatures.sign(SECRET, body)
    headers = {
        "X-Sig": signed["pgmsg-signature"],
        "X-Time": signed["pgmsg-timestamp"],
        "X-Trace": "t-1",
    }
    assert post(client, "custom", body, headers).status_code == 200
    (row,) = stored()
    assert (row.inbox, row.message_id, row.type, row.aggregate_id, row.trace_id, row.source) == (
        "test.ordered",
        "42",
        "tick",
        "7",
        "t-1",
        "shop",
    )


def test_an_unknown_webhook_is_404_and_a_get_405(client):
    assert post(client, "nope", b"{}", {}).status_code == 404
    assert client.get("/pgmsg/webhooks/pgmsg/").status_code == 405


def test_a_wrong_webhook_setting_is_a_system_check_error():
    bad = {
        "noinbox": {"inbox": "no.such.inbox", "secret": "s"},
        "nosecret": {"inbox": "test.inbox"},
        "badformat": {"inbox": "test.inbox", "secret": "s", "format": "slack"},
        "badfield": {"inbox": "test.inbox", "secret": "s", "type": "cookie:x"},
        "unknown": {"inbox": "test.inbox", "secret": "s", "colour": "red"},
    }
    with override_settings(PGMSG={**conf.get().__dict__, "WEBHOOKS": bad}):
        found = [m for m in checks.run_checks() if m.id == "pgmsg.E402"]
    text = "\n".join(m.msg for m in found)
    assert len(found) == 5, text
    for expected in ("no.such.inbox", "needs 'secret'", "'slack'", "cookie:x", "colour"):
        assert expected in text
    assert "'s'" not in text  # no secret in a check's message
