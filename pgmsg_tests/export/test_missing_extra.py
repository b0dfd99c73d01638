"""The Spark commands without the `spark` extra: --help works, a run is one line naming the
extra (not a traceback). The libraries are hidden from the command's process, not uninstalled
(pgmsg_tests/scripts/without.py)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from pgmsg_tests.conftest import ROOT, WorkerProcesses

pytestmark = pytest.mark.django_db


def without(hidden: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pgmsg_tests.scripts.without", hidden, *args],
        cwd=ROOT,
        env=WorkerProcesses(ROOT).env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "hidden, command",
    [
        ("pyspark,pyarrow", "pgmsg_export"),
        ("pyspark,pyarrow", "pgmsg_archive"),
        ("matplotlib", "pgmsg_report"),
    ],
)
def test_help_works_without_the_extra(hidden, command):
    done = without(hidden, command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:") and not done.stderr


@pytest.mark.parametrize(
    "hidden, args, missing",
    [
        ("pyspark,pyarrow", ["pgmsg_export", "--output", "/nonexistent/lake"], "pyspark|pyarrow"),
        (
            "pyspark,pyarrow",
            ["pgmsg_export", "--output", "/nonexistent/lake", "--follow", "--checkpoint", "/x"],
            "pyspark|pyarrow",
        ),
        ("pyspark,pyarrow", ["pgmsg_archive", "--list"], "pyspark|pyarrow"),
        ("matplotlib", ["pgmsg_report", "--lake", "/nonexistent/lake"], "matplotlib"),
    ],
)
def test_a_run_without_the_extra_is_one_line_naming_it(hidden, args, missing):
    done = without(hidden, *args)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()  # one line, no traceback
    assert re.fullmatch(
        f"CommandError: {args[0]} needs the `spark` extra: ({missing}) is not installed; "
        + re.escape(
            "pip install pyspark pyarrow matplotlib (or the checkout with its extra: "
            "'./pgmsg[spark]')"
        ),
        line,
    ), line
