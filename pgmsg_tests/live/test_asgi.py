"""pgmsg.live.asgi: the stream outlives Django's request handling, and behaves as the view's
own streaming response does (both served here by a real uvicorn)."""

from __future__ import annotations

import json
import socket
import struct
import urllib.request

import pytest

from pgmsg_tests.conftest import wait_for
from pgmsg_tests.live.test_live import append

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def hub_clients(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/live/hub", timeout=30) as answer:
        return json.load(answer)["clients"]


def hang_up(port: int, path: str) -> None:
    """Open a stream, read its head, then reset the connection."""
    rude = socket.create_connection(("127.0.0.1", port))
    rude.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    rude.recv(100)
    rude.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    rude.close()


@pytest.mark.parametrize("app", ["application", "django_only"])
def test_clients_that_hang_up_are_let_go_and_the_others_keep_receiving(
    live_server_factory, sse, app
):
    server = live_server_factory(app=app)
    steady = sse("/live/events?category=asgigo", server=server)
    assert steady.status == 200, (steady.body, server.log())
    assert steady.headers["content-type"].startswith("text/event-stream")
    assert "content-length" not in steady.headers
    append("asgigo-1", 1)
    assert [e["data"]["n"] for e in steady.events(1)] == [1]
    assert hub_clients(server.port) == 1
    for _ in range(5):
        hang_up(server.port, "/live/events?category=asgigo")
    append("asgigo-1", 2)
    assert [e["data"]["n"] for e in steady.events(1)] == [2]
    wait_for(lambda: hub_clients(server.port) == 1, message="the hub let go of the five")
    steady.close()
    wait_for(lambda: hub_clients(server.port) == 0, message="the hub let go of the last")
    assert "Traceback" not in server.log()


def test_a_refusal_through_the_wrapper_is_django_s_answer_untouched(live, sse):
    refused = sse("/live/guarded?category=secret")
    assert (refused.status, refused.body) == (403, "forbidden\n")
    assert sse("/live/events?category=Not A Category").status == 400
