"""The live endpoint under a real uvicorn: events appended by this process reach a client of
the server process; resuming by Last-Event-ID misses nothing and repeats nothing."""

from __future__ import annotations

import json

import pytest
from django.db import connection

import pgmsg
from pgmsg_tests.conftest import skip_unless, wait_for
from pgmsg_tests.live.sse import Closed, SseClient
from pgmsg_tests.testapp.events_handlers import Step

try:
    import httpx
except ImportError:  # pragma: no cover - the dev extra installs it
    httpx = None

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def append(stream: str, *numbers: int, tag: str = "") -> None:
    for n in numbers:
        pgmsg.append(stream, Step(n=n, tag=tag))


def hub_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'pgmsg live %%'"
        )
        return cursor.fetchone()[0]


@pytest.fixture
def follow(sse):
    def open_stream(path: str, **kwargs) -> SseClient:
        client = sse(path, **kwargs)
        assert client.status == 200, client.body
        return client

    return open_stream


def test_a_client_receives_events_appended_by_another_process(live, follow):
    client = follow("/live/events?category=livea")
    assert client.headers["content-type"].startswith("text/event-stream")
    assert client.headers["cache-control"] == "no-cache"
    assert client.headers["x-accel-buffering"] == "no"
    append("livea-1", 1, 2)
    append("liveb-1", 99)  # another category: not for this client
    append("livea-2", 3)
    got = client.events(3)
    assert [(e["stream"], e["data"]["n"]) for e in got] == [
        ("livea-1", 1),
        ("livea-1", 2),
        ("livea-2", 3),
    ]
    assert [int(m["id"]) for m in client.messages] == [e["position"] for e in got]
    assert got[0]["type"] == "test.step"


def test_filters_by_stream_and_type(live, follow):
    append("livef-1", 0)
    append("livef-2", 0)
    by_stream = follow("/live/streams/livef-2")
    by_type = follow("/live/events?category=livef&type=test.other")
    append("livef-1", 1)
    append("livef-2", 2)
    assert [e["data"]["n"] for e in by_stream.events(1)] == [2]
    with pytest.raises(TimeoutError):
        by_type.next_message(timeout=1)


def test_a_client_cut_off_before_its_first_event_resumes_from_the_id_it_was_given(live, follow):
    """A new client's first message is an id without data (the newest event's position when
    it came): EventSource keeps it as its Last-Event-ID, so a reconnect before any event
    misses nothing of what was appended meanwhile."""
    append("livecut-1", 1)
    client = follow("/live/events?category=livecut")
    with pytest.raises(TimeoutError):
        client.next_message(timeout=1)  # nothing yet: only the id, no event
    given = client.last_event_id
    assert given is not None and int(given) > 0
    client.close()
    append("livecut-1", 2, 3)
    again = follow("/live/events?category=livecut", last_event_id=given)
    assert [e["data"]["n"] for e in again.events(2)] == [2, 3]
    with pytest.raises(TimeoutError):
        again.next_message(timeout=1)  # and 1, sent before the first connection, not again


def test_resuming_with_last_event_id_gets_what_was_missed_once_and_in_order(live, follow):
    client = follow("/live/events?category=liver")
    append("liver-1", 1, 2)
    first = client.events(2)
    client.close()
    append("liver-1", 3, 4)
    append("liver-2", 5)
    resumed = follow("/live/events?category=liver", last_event_id=first[-1]["position"])
    append("liver-1", 6)
    assert [e["data"]["n"] for e in resumed.events(4)] == [3, 4, 5, 6]
    with pytest.raises(TimeoutError):
        resumed.next_message(timeout=1)


def test_a_client_resumes_across_a_server_restart(live, follow):
    client = follow("/live/events?category=liverestart")
    append("liverestart-1", 1)
    last = client.events(1)[-1]["position"]
    live.kill()
    with pytest.raises((Closed, OSError)):
        client.next_message(timeout=5)
    append("liverestart-1", 2, 3)
    live.start()
    resumed = follow("/live/events?category=liverestart", last_event_id=last)
    append("liverestart-1", 4)
    assert [e["data"]["n"] for e in resumed.events(3)] == [2, 3, 4]


def test_the_server_process_holds_two_postgresql_connections_whatever_its_clients(live, follow):
    clients = [follow(f"/live/events?category=liveconn{i % 3}") for i in range(12)]
    append("liveconn0-1", 1)
    assert clients[0].events(1)[0]["data"]["n"] == 1
    wait_for(lambda: hub_connections() == 2, message="the hub's two connections")
    assert hub_connections() == 2


def test_a_broadcast_channel_reaches_its_clients(live, follow):
    from pgmsg_tests.testapp.channels import Shout

    client = follow("/live/channels?channel=test.shout")

    def heard() -> bool:
        pgmsg.notify(Shout(text="hello"))
        try:
            return client.next_message(timeout=0.5)
        except TimeoutError:
            return False

    message = wait_for(heard, message="a broadcast through the live endpoint")
    assert message["data"] == '{"text": "hello"}' or '"hello"' in message["data"]
    assert "id" not in message  # best-effort: no resume point


def test_a_view_s_categories_bound_what_a_client_without_one_gets_live_and_on_resume(live, follow):
    client = follow("/live/guarded")  # categories secret, boom, open; the hook allows this
    append("open-3", 1)
    append("liveother-1", 99)
    append("secret-1", 2)
    first = client.events(2)
    assert [(e["stream"], e["data"]["n"]) for e in first] == [("open-3", 1), ("secret-1", 2)]
    client.close()
    append("liveother-1", 98)
    append("open-3", 3)
    resumed = follow("/live/guarded", last_event_id=first[0]["position"])
    assert [e["data"]["n"] for e in resumed.events(2)] == [2, 3]
    with pytest.raises(TimeoutError):
        resumed.next_message(timeout=1)


def test_an_httpx_client_reads_the_stream_and_resumes(live):
    skip_unless(httpx is not None, "httpx is not installed (pip install -e .[dev])")
    url = f"http://127.0.0.1:{live.port}/live/events?category=livehttpx"

    def read(count: int, headers: dict) -> list[tuple[str, int]]:
        got = []
        with httpx.Client(timeout=30) as client, client.stream("GET", url, headers=headers) as r:
            assert r.status_code == 200
            append("livehttpx-1", *range(len(seen) + 1, len(seen) + 1 + count))
            event_id = None
            for line in r.iter_lines():
                if line.startswith("id: "):
                    event_id = line[4:]
                elif line.startswith("data: "):
                    got.append((event_id, json.loads(line[6:])["data"]["n"]))
                    if len(got) == count:
                        return got
        return got

    seen: list[tuple[str, int]] = []
    seen += read(2, {})
    seen += read(2, {"Last-Event-ID": seen[-1][0]})
    assert [n for _id, n in seen] == [1, 2, 3, 4]
