"""The live endpoint under pressure and bad input: each client gets a clear answer and the
server goes on serving the others."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client as DjangoClient

import pgmsg
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.live.conftest import free_port
from pgmsg_tests.live.sse import Closed, SseClient
from pgmsg_tests.live.test_live import append, hub_connections
from pgmsg_tests.testapp.events_handlers import Step

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def answer(live, path: str, **kwargs) -> tuple[int, str]:
    client = SseClient(live.port, path, **kwargs)
    client.close()
    return client.status, client.body


def positions(messages: list[dict]) -> list[int]:
    return [int(m["id"]) for m in messages if "id" in m]


@pytest.mark.parametrize(
    ("path", "last_event_id", "status", "reason"),
    [
        ("/live/streams/livebad-404", None, 404, "no stream named 'livebad-404'"),
        ("/live/guarded?category=other", None, 404, "no live category 'other' here"),
        ("/live/events?category=Bad!", None, 400, "invalid category 'Bad!'"),
        ("/live/events?category=livebad&type=no%20such", None, 400, "invalid event type name"),
        ("/live/events?category=livebad", "12abc", 400, "is not an event position"),
        ("/live/events?category=livebad", "-1", 400, "is not an event position"),
        ("/live/events?category=livebad", "99999999999", 400, "is after the store's last event"),
        ("/live/channels?channel=nope", None, 404, "no live channel named 'nope' here"),
        ("/live/channels", None, 400, "ask for a channel"),
        ("/live/events?category=livebad&stream=livebad-1", None, 400, "not both"),
    ],
)
def test_bad_input_gets_a_clear_answer(live, path, last_event_id, status, reason):
    append("livebad-1", 1)
    got, body = answer(live, path, last_event_id=last_event_id)
    assert got == status
    assert reason in body


def test_a_denying_hook_answers_403_and_a_raising_one_500_while_others_are_served(live, sse):
    other = sse("/live/guarded?category=open")
    assert other.status == 200
    assert answer(live, "/live/guarded?category=secret") == (403, "forbidden\n")
    status, body = answer(live, "/live/guarded?category=boom")
    assert status == 500 and "authorization hook failed" in body
    assert "RuntimeError: the hook broke" in live.log()
    append("open-1", 1)
    assert other.events(1)[0]["data"]["n"] == 1


def test_by_default_only_a_user_with_view_storedevent_may_follow(live, sse):
    assert answer(live, "/live/default?category=open")[0] == 403
    user = User.objects.create_user("watcher", password="a-long-test-password")
    browser = DjangoClient()
    browser.force_login(user)
    cookie = {"Cookie": f"sessionid={browser.cookies['sessionid'].value}"}
    assert answer(live, "/live/default?category=open", headers=cookie)[0] == 403
    user.user_permissions.add(Permission.objects.get(codename="view_storedevent"))
    client = sse("/live/default?category=open", headers=cookie)
    assert client.status == 200
    append("open-2", 7)
    assert client.events(1)[0]["data"]["n"] == 7


def test_silence_is_filled_with_heartbeats(live_server_factory, sse):
    server = live_server_factory(settings={"LIVE_HEARTBEAT": 0.1})
    client = sse("/live/events?category=livequiet", server=server)
    with pytest.raises(TimeoutError):
        client.next_message(timeout=1)
    assert "heartbeat" in client.comments
    assert client.retry == 2000


def test_an_event_too_large_for_one_message_is_replaced_by_a_notice(live_server_factory, sse):
    server = live_server_factory(settings={"LIVE_MAX_EVENT_BYTES": 2000})
    client = sse("/live/events?category=livebig", server=server)
    append("livebig-1", 1, tag="x" * 5000)
    append("livebig-1", 2)
    skipped, small = client.next_message(), client.next_message()
    assert skipped["event"] == "pgmsg-skipped"
    notice = json.loads(skipped["data"])
    assert notice["stream"] == "livebig-1" and notice["version"] == 1 and notice["data"] is None
    assert "over PGMSG LIVE_MAX_EVENT_BYTES (2000)" in notice["reason"]
    assert json.loads(small["data"])["data"]["n"] == 2
    assert int(skipped["id"]) < int(small["id"])


def test_a_slow_client_is_cut_off_with_a_retry_hint_and_resumes_without_loss(
    live_server_factory, sse
):
    server = live_server_factory(settings={"LIVE_CLIENT_BUFFER": 5})
    slow = sse("/live/events?category=liveslow", server=server, receive_buffer=4096)
    for n in range(300):  # about 9 MB: more than the sockets' buffers hold
        append("liveslow-1", n, tag="y" * 30000)
    got = slow.rest()  # now read: what was sent, then the closing message
    assert got[-1]["event"] == "pgmsg-closing" and "slow client" in got[-1]["data"]
    assert slow.retry == 2000
    received = [json.loads(m["data"])["data"]["n"] for m in got if "id" in m]
    assert received == list(range(len(received))) and len(received) < 300
    # Resume as EventSource does: from the last id, again whenever the stream ends. A resumed
    # client can be cut as slow once more (the hub may still be reading the 9 MB when it
    # joins the live clients, and then offers it pages of them at once).
    # The client may have been cut before its first event: the id it was given first (the
    # newest event when it came) is then its Last-Event-ID, as in a browser.
    last_id, resumes = slow.last_event_id, 0
    while len(received) < 300 and resumes < 30:
        resumed = sse("/live/events?category=liveslow", server=server, last_event_id=last_id)
        resumes += 1
        with contextlib.suppress(Closed):
            while len(received) < 300:
                message = resumed.next_message()
                if "id" in message:
                    received.append(json.loads(message["data"])["data"]["n"])
                    last_id = message["id"]
    assert received == list(range(300))


def test_a_client_that_hangs_up_mid_event_leaves_the_others_served(live, sse):
    steady = sse("/live/events?category=livehang")
    rude = socket.create_connection(("127.0.0.1", live.port))
    rude.sendall(b"GET /live/events?category=livehang HTTP/1.1\r\nHost: x\r\n\r\n")
    rude.recv(100)  # the head
    append("livehang-1", 1, tag="z" * 60000)
    rude.recv(1000)  # part of the event's message
    rude.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    rude.close()  # a reset, mid-message
    append("livehang-1", 2)
    assert [e["data"]["n"] for e in steady.events(2)] == [1, 2]
    late = sse("/live/events?category=livehang")
    append("livehang-1", 3)
    assert late.events(1)[0]["data"]["n"] == 3
    assert hub_connections() == 2


def test_sigterm_ends_every_stream_with_a_retry_hint_and_the_server_exits(live, sse):
    clients = [sse("/live/events?category=livestop") for _ in range(3)]
    append("livestop-1", 1)
    for client in clients:
        client.events(1)
    os.kill(live.proc.pid, signal.SIGTERM)
    for client in clients:
        last = client.rest()[-1]
        assert last["event"] == "pgmsg-closing" and "shutting down" in last["data"]
    # uvicorn re-raises the signal it caught once it has shut down (so -SIGTERM, not 0).
    assert live.proc.wait(timeout=60) in (0, -signal.SIGTERM)
    assert "Traceback" not in live.log()


def test_a_stream_that_resumes_ahead_of_the_hub_gets_nothing_twice(live, sse):
    """A client that comes from another server process may resume from an event this hub has
    not offered yet: nothing at or before its Last-Event-ID is sent again."""
    first = sse("/live/events?category=liveahead")
    pgmsg.append("liveahead-1", [Step(n=1), Step(n=2)])
    one, two = first.events(2)
    again = sse("/live/events?category=liveahead", last_event_id=one["position"])
    append("liveahead-1", 3)
    assert [e["data"]["n"] for e in again.events(2)] == [2, 3]
    with pytest.raises((TimeoutError, Closed)):
        again.next_message(timeout=1)
    wait_for(lambda: hub_connections() == 2, message="two connections")


def test_without_postgresql_a_client_is_told_to_come_back_not_refused(live_server_factory, sse):
    """EventSource gives up for good on an error status: while the hub cannot reach
    PostgreSQL, a new client gets a stream that ends at once with a retry hint."""
    server = live_server_factory(url=f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere")
    client = sse("/live/events?category=livenopg", server=server)
    assert client.status == 200
    last = client.rest(timeout=60)[-1]
    assert last["event"] == "pgmsg-closing" and "PostgreSQL is unreachable" in last["data"]
    assert client.retry == 2000
