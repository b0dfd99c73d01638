"""A Django project served by a real gunicorn (its own process group), for the webhook tests:
started on a free port, waited for, killed and restarted by the test."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Gunicorn:
    def __init__(
        self, app: str, env: dict, log_path: Path, *, workers: int = 2, port: int | None = None
    ) -> None:
        self.app, self.env, self.log_path, self.workers = app, env, log_path, workers
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> Gunicorn:
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "--bind",
                    f"127.0.0.1:{self.port}",
                    "--workers",
                    str(self.workers),
                    "--timeout",
                    "30",
                    "--preload",
                    "--graceful-timeout",
                    "1",
                    self.app,
                ],
                cwd=ROOT,
                env={**os.environ, **self.env, "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited: {self.log_path.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"gunicorn did not listen in {timeout}s")

    def worker_pids(self) -> list[int]:
        """The worker processes (children of the master), which a test may SIGKILL: the master
        starts new ones."""
        if self.proc is None:
            return []
        found = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True
        ).stdout
        return [int(pid) for pid in found.split()]

    def kill(self) -> None:
        """SIGKILL the master and its workers at once (the whole process group)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.proc = None
