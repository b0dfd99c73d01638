"""Shared fixtures: worker processes against the test database, and a clean slate per test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from django.db import connection

from pgmsg_dev.devdb import database_url

ROOT = Path(__file__).resolve().parent.parent


class WorkerProcesses:
    """`manage.py listen` processes against the test database, stopped at the end of the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen] = []

    def env(self) -> dict:
        env = dict(os.environ)
        env["DATABASE_URL"] = database_url(connection.settings_dict)
        env["DJANGO_SETTINGS_MODULE"] = "pgmsg_tests.settings"
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def start(
        self, *args: str, env: dict | None = None, prefix: Sequence[str] = ()
    ) -> subprocess.Popen:
        """``prefix``: a command that execs the worker's (nsenter into a network namespace)."""
        log_path = self.tmp_path / f"worker{len(self.procs)}.log"
        with open(log_path, "w") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", "django", "listen", "-v", "2", *args],
                cwd=ROOT,
                env={**self.env(), **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc.log_path = str(log_path)
        self.procs.append(proc)
        return proc

    def log(self, proc: subprocess.Popen) -> str:
        return Path(proc.log_path).read_text()

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()


@pytest.fixture
def workers(tmp_path):
    procs = WorkerProcesses(tmp_path)
    yield procs
    procs.stop_all()


def wait_for(predicate, *, timeout: float = 60.0, interval: float = 0.05, message: str = ""):
    """Poll until predicate() is truthy; fail the test with ``message`` after ``timeout``.

    A generous timeout only bounds a broken run: it is not a speed assertion.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for: {message or predicate}")


def skip_unless(available: bool, reason: str) -> None:
    """Skip the test, saying why, when something it needs is absent from this machine; with
    PGMSG_NO_SKIP=1 (set by .ci/run) fail instead, so CI cannot pass by skipping it."""
    if available:
        return
    if os.environ.get("PGMSG_NO_SKIP") == "1":
        pytest.fail(f"PGMSG_NO_SKIP=1 and {reason}")
    pytest.skip(reason=reason)


def pytest_collection_modifyitems(config, items):
    """With the wire layer's fast path off (PGMSG_TEST_THROUGH_DJANGO_CURSOR=1, settings.py),
    the tests of that path itself (marked wire_fast_path) are left out: deselected, not
    skipped, so that PGMSG_NO_SKIP=1 can run that way too."""
    from django.conf import settings

    if not getattr(settings, "THROUGH_DJANGO_CURSOR", False):
        return
    left_out = [item for item in items if item.get_closest_marker("wire_fast_path")]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker("wire_fast_path")]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under PGMSG_NO_SKIP=1 (.ci/run) a skip of any kind fails: CI has every service and
    tool the tests need, so a skip there means something is broken, not absent."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("PGMSG_NO_SKIP") == "1":
        report.outcome = "failed"
        report.longrepr = f"PGMSG_NO_SKIP=1 and the test skipped: {report.longrepr}"


@pytest.fixture(autouse=True)
def _no_seals_left(request):
    """Workers seal ended months of the event store (pgmsg/events/partitions.py), which then
    refuse new rows: a later test that moves events into a past month must find none sealed."""
    yield
    if "django_db_blocker" not in request.fixturenames and not any(
        request.node.iter_markers("django_db")
    ):
        return
    blocker = request.getfixturevalue("django_db_blocker")
    with blocker.unblock():
        if connection.in_atomic_block:
            return  # a test run in a transaction: its seals, if any, roll back with it
    with blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT format('ALTER TABLE %I DROP CONSTRAINT %I', c.relname, s.conname) "
            "FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid "
            "JOIN pg_constraint AS s ON s.conrelid = c.oid "
            "WHERE i.inhparent = to_regclass('pgmsg_event') "
            "AND s.conname LIKE 'pgmsg\\_sealed\\_below\\_%'"
        )
        for (statement,) in cursor.fetchall():
            cursor.execute(statement)
