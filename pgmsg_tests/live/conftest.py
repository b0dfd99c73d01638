"""A real ASGI server (uvicorn, in its own process) serving the test project's live endpoints."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import ROOT, skip_unless

try:
    import uvicorn
except ImportError:  # pragma: no cover - the dev extra installs it
    uvicorn = None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveServer:
    """``uvicorn pgmsg_tests.asgi:<app>`` on a port of its own; restartable. ``app``:
    ``application`` (live streams served by pgmsg.live.asgi) or ``django_only``."""

    def __init__(
        self, tmp_path: Path, *, url: str, settings: dict | None = None, app: str = "application"
    ) -> None:
        self.app = app
        self.port = free_port()
        self.url = url
        self.tmp_path = tmp_path
        self.env = {
            **os.environ,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "pgmsg_tests.settings",
            "PYTHONUNBUFFERED": "1",
            "PGMSG_TEST_LOG_LEVEL": "INFO",
            "PGMSG_TEST_SETTINGS": json.dumps(settings or {}),
        }
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> LiveServer:
        self.starts += 1
        self.log_path = self.tmp_path / f"uvicorn{self.starts}.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    f"pgmsg_tests.asgi:{self.app}",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--log-level",
                    "warning",
                ],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"uvicorn exited at start:\n{self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        pytest.fail(f"uvicorn did not listen on port {self.port}:\n{self.log()}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.proc is not None:
            self._wait_for_sessions_to_end(self.proc.pid)

    def _wait_for_sessions_to_end(self, pid: int) -> None:
        """PostgreSQL ends a killed client's sessions a moment later: wait, so that the test
        database can be dropped at the end of the run."""
        try:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError:
            return  # a server pointed at no PostgreSQL (a test of that)
        with conn:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                left = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                    [f"pgmsg live {pid}"],
                ).fetchone()[0]
                if not left:
                    return
                time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text()


@pytest.fixture
def live_server_factory(tmp_path):
    skip_unless(uvicorn is not None, "uvicorn is not installed (pip install -e .[dev])")
    servers: list[LiveServer] = []

    def make(
        *, url: str | None = None, settings: dict | None = None, app: str = "application"
    ) -> LiveServer:
        server = LiveServer(
            tmp_path, url=url or database_url(connection.settings_dict), settings=settings, app=app
        )
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        server.kill()


@pytest.fixture
def live(live_server_factory):
    return live_server_factory()


@pytest.fixture
def sse(live):
    """Open SSE clients on ``live`` (closed at the end of the test)."""
    from pgmsg_tests.live.sse import SseClient

    opened: list[SseClient] = []

    def open_client(path: str, *, server: LiveServer | None = None, **kwargs) -> SseClient:
        client = SseClient((server or live).port, path, **kwargs)
        opened.append(client)
        return client

    yield open_client
    for client in opened:
        client.close()
