"""manage.py listen says when it starts (and what it serves) and when it stops, nothing more
per message; --autoreload restarts it when a Python file changes."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

import pgmsg
from pgmsg_tests.conftest import ROOT, WorkerProcesses, wait_for
from pgmsg_tests.helpers import effect_counts
from pgmsg_tests.testapp.channels import Work

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path, Path]:
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    env = WorkerProcesses(tmp_path).env()
    env.pop("XDG_RUNTIME_DIR", None)  # as in containers and CI: no warning may show
    # Not a test process: with pytest's variables set, Django's reloader child never noticed
    # a change here.
    env.pop("PYTEST_CURRENT_TEST", None)
    env.pop("PYTEST_VERSION", None)
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "listen", *args],
            cwd=ROOT,
            env=env,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
    return proc, out, err


def listening() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'LISTEN %%'"
        )
        return cursor.fetchone()[0]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_one_line_at_start_one_at_stop_and_quiet_in_between(tmp_path):
    proc, out, err = start(tmp_path, "test.work")
    try:
        wait_for(lambda: out.read_text(), message="the start line")
        pgmsg.notify_many(Work(key=f"k{i}") for i in range(20))
        wait_for(lambda: len(effect_counts()) == 20, message="20 messages handled")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        stop(proc)
    lines = out.read_text().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("pgmsg listen: 1 channel(s) test.work (2 listener function(s))")
    assert lines[0].endswith(f"; 1 process(es), pid {proc.pid}")
    assert lines[1] == f"pgmsg listen: stopped (pid {proc.pid}, 20 handled)"
    assert err.read_text() == ""


def test_the_start_line_names_inboxes_and_subscriptions_and_processes(tmp_path):
    proc, out, _ = start(
        tmp_path, "--inbox", "test.inbox", "--subscription", "test-ledger", "--processes", "2"
    )
    try:
        wait_for(lambda: out.read_text(), message="the start line")
        # Both children up before the signal (a signal while the supervisor is still forking
        # is the supervisor's race, not what this test is about).
        wait_for(lambda: listening() == 2, message="2 processes listening")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        stop(proc)
    start_line, stop_line = out.read_text().splitlines()
    assert "1 inbox(es) test.inbox; 1 subscription(s) test-ledger; 2 process(es)" in start_line
    assert stop_line == "pgmsg listen: stopped (2 processes)"


def test_autoreload_restarts_the_worker_when_a_python_file_changes(tmp_path):
    proc, out, _ = start(tmp_path, "test.work", "--autoreload")
    try:
        wait_for(lambda: out.read_text().count("autoreload") == 1, message="first start")
        pgmsg.notify(Work(key="before"))
        wait_for(lambda: effect_counts().get("before"), message="handled before the change")
        listeners = ROOT / "pgmsg_tests" / "testapp" / "listeners.py"

        def changed_and_restarted() -> bool:
            # A newer modification time: the file "changed". Touched again on each poll, since
            # a change made before the reloader's first scan of the files is not one to it.
            os.utime(listeners)
            return out.read_text().count("autoreload") >= 2

        wait_for(changed_and_restarted, interval=1.0, message="restarted")
        pgmsg.notify(Work(key="after"))
        wait_for(lambda: effect_counts().get("after"), message="handled after the restart")
    finally:
        stop(proc)


def test_autoreload_is_for_one_process():
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--autoreload runs one process"):
        call_command("listen", "--autoreload", "--processes", "2")


@pytest.mark.parametrize(
    "how", ["Ctrl-C (SIGINT to the process group)", "SIGTERM to the command's process"]
)
def test_autoreload_stops_gracefully_and_says_so(tmp_path, how):
    proc, out, err = start(tmp_path, "test.work", "--autoreload")
    try:
        wait_for(lambda: "autoreload" in out.read_text(), message="the start line")
        pgmsg.notify(Work(key="one"))
        wait_for(lambda: effect_counts().get("one"), message="handled")
        if how.startswith("Ctrl-C"):
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        wait_for(lambda: listening() == 0, message="no worker left listening")
    finally:
        stop(proc)
    start_line, stop_line = out.read_text().splitlines()
    child = int(start_line.rsplit("pid ", 1)[1])
    assert child != proc.pid  # the worker runs in the reloader's child
    assert stop_line == f"pgmsg listen: stopped (pid {child}, 1 handled)"
    # Nothing at INFO level at verbosity 1 (the reloader's lines were printed twice).
    assert " INFO " not in err.read_text(), err.read_text()
