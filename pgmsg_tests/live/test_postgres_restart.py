"""The live endpoint across a PostgreSQL restart, on a private embedded server of this test's
own (the shared servers are never restarted): the clients stay connected, and once PostgreSQL
is back they get every event, once, in order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import psycopg
import pytest

from pgmsg_dev import devdb
from pgmsg_tests.conftest import ROOT, wait_for

pytestmark = [pytest.mark.processes]

DATA_DIR = ROOT / ".pgdata-live"


@pytest.fixture(scope="module")
def private_postgres():
    """A migrated database on an embedded server of its own (made once, kept in
    .pgdata-live/), and the server's handle to restart it."""
    url = devdb.embedded_database_url(DATA_DIR, name="pgmsg_live")
    server = devdb._servers[-1]
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "PGMSG_LOGICAL_DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "pgmsg_tests.settings",
    }
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    return url, server


def append(url: str, stream: str, n: int) -> None:
    """pgmsg_append, the SQL function behind pgmsg.append(), from a connection of its own."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "SELECT pgmsg_append(%s, %s, %s::text[], %s::text[], %s::text[], %s::uuid[], NULL)",
            [
                stream,
                stream.split("-")[0],
                ["test.step"],
                [json.dumps({"n": n, "sleep": 0.0, "fail": False, "tag": ""})],
                ["{}"],
                [uuid.uuid4()],
            ],
        )


def hub_connections(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'pgmsg live %%'"
        ).fetchone()[0]


def test_clients_get_every_event_once_after_postgresql_restarts(
    private_postgres, live_server_factory, tmp_path
):
    from pgmsg_tests.live.sse import SseClient

    url, server = private_postgres
    live = live_server_factory(url=url, settings={"LIVE_HEARTBEAT": 0.5})
    stream = f"liverestart-{uuid.uuid4().hex[:8]}"
    clients = [SseClient(live.port, "/live/events?category=liverestart") for _ in range(3)]
    try:
        append(url, stream, 1)
        for client in clients:
            assert client.events(1)[0]["data"]["n"] == 1
        devdb.restart(server, DATA_DIR)  # cuts the hub's two sessions
        append(url, stream, 2)  # before or after the hub is back: it reads from where it stood
        append(url, stream, 3)
        for client in clients:
            assert [e["data"]["n"] for e in client.events(2)] == [2, 3]
        append(url, stream, 4)
        for client in clients:
            assert client.events(1)[0]["data"]["n"] == 4
            with pytest.raises(TimeoutError):
                client.next_message(timeout=0.5)
        assert "PostgreSQL lost" in live.log() or "LISTEN connection lost" in live.log()
        wait_for(lambda: hub_connections(url) == 2, message="the hub's two connections back")
    finally:
        for client in clients:
            client.close()
