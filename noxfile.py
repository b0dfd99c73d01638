"""The compatibility matrix: Python 3.11-3.13 x Django 5.2 / 6.0 x embedded PostgreSQL / PG 15.

``nox`` (or ``make matrix``) runs every cell, then writes the table in docs/compatibility.md.
One cell: ``nox -s "tests(python='3.13', django='6.0', server='embedded')"``.

Two sessions beside the matrix, run only when named (embedded server): ``nox -s
through_django_cursor`` runs the suite with the wire layer's fast path off (docs/wire.md), and
``nox -s oldest_psycopg`` with the oldest psycopg that setup.cfg allows. Django 6.0 needs
Python 3.12+. The ``pg15`` cells use the server at 127.0.0.1:5432 (MATRIX_PG15_URL to change
it) with a database of their own per cell; the ``embedded`` cells use the embedded PostgreSQL
in .pgdata/, also with a database of their own.
"""

from __future__ import annotations

import configparser
import glob
import os
import re
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / ".nox" / "results"
PG15_URL = os.environ.get("MATRIX_PG15_URL", "postgres://postgres@127.0.0.1:5432")

PYTHONS = ["3.11", "3.12", "3.13"]
DJANGOS = {"5.2": "django>=5.2,<5.3", "6.0": "django>=6.0,<6.1"}
SERVERS = ["embedded", "pg15"]

# pyenv keeps each interpreter in its own folder; its shims answer only for the selected
# version, so put the folders themselves on PATH for nox to find python3.X.
for _bin in sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[1-3].*/bin"))):
    os.environ["PATH"] = _bin + os.pathsep + os.environ["PATH"]

nox.options.sessions = ["tests", "table"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True


def cells() -> list:
    return [
        nox.param(py, dj, server, id=f"python='{py}', django='{dj}', server='{server}'")
        for py in PYTHONS
        for dj in DJANGOS
        for server in SERVERS
        if not (dj == "6.0" and py == "3.11")
    ]


@nox.session
@nox.parametrize("python,django,server", cells())
def tests(session: nox.Session, django: str, server: str) -> None:
    """pgmsg's whole test suite in one cell of the matrix."""
    session.install("-e", ".[dev]", DJANGOS[django])
    cell = f"py{session.python.replace('.', '')}_dj{django.replace('.', '')}_{server}"
    env = {"PGMSG_TEST_DATABASE": f"pgmsg_nox_{cell}"}
    if server == "pg15":
        env["DATABASE_URL"] = f"{PG15_URL}/pgmsg_nox_{cell}"
    else:
        env["DATABASE_URL"] = ""  # unset: the embedded server
    RESULTS.mkdir(parents=True, exist_ok=True)
    versions = session.run(
        "python",
        "-c",
        "import platform, django; print(platform.python_version(), django.get_version())",
        silent=True,
    )
    (RESULTS / f"{cell}.versions").write_text(versions.strip().splitlines()[-1])
    session.run(
        "python",
        "-m",
        "pytest",
        "-q",
        f"--junitxml={RESULTS / cell}.xml",
        *session.posargs,
        env=env,
    )


def oldest_allowed(package: str) -> str:
    """The lower bound setup.cfg's install_requires gives ``package`` (``>=X``)."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    for line in config["options"]["install_requires"].split("\n"):
        found = re.fullmatch(
            rf"{re.escape(package)}(\[[^]]*\])?\s*>=\s*([\w.]+)(,.*)?", line.strip()
        )
        if found:
            return found.group(2)
    raise ValueError(f"setup.cfg gives {package} no lower bound")


def pytest_alone(session: nox.Session, name: str, env: dict[str, str]) -> None:
    """The whole suite (or ``session.posargs``) in a database of its own on the embedded
    server."""
    session.run(
        "python",
        "-m",
        "pytest",
        "-q",
        *session.posargs,
        env={"PGMSG_TEST_DATABASE": f"pgmsg_nox_{name}", "DATABASE_URL": "", **env},
    )


@nox.session(python=PYTHONS[-1])
def through_django_cursor(session: nox.Session) -> None:
    """The suite with every producer and batch statement through Django's cursor
    (PGMSG["SEND_THROUGH_DJANGO_CURSOR"]), its fast path's own tests left out."""
    session.install("-e", ".[dev]")
    pytest_alone(session, "through_django", {"PGMSG_TEST_THROUGH_DJANGO_CURSOR": "1"})


@nox.session(python=PYTHONS[0])
def oldest_psycopg(session: nox.Session) -> None:
    """The suite with the oldest psycopg setup.cfg allows (the wire layer uses its libpq
    wrapper, docs/wire.md)."""
    version = oldest_allowed("psycopg")
    session.install("-e", ".[dev]")
    # Named apart, not as psycopg[binary]: psycopg 3.2.0's binary extra asks for
    # psycopg-binary 3.2.0.dev1, which was never published.
    session.install(f"psycopg=={version}", f"psycopg-binary=={version}")
    session.run("python", "-c", "import psycopg; print('psycopg', psycopg.__version__)")
    pytest_alone(session, "oldest_psycopg", {})


@nox.session(python=False)
def table(session: nox.Session) -> None:
    """Write the results of the last run of every cell into docs/compatibility.md."""
    session.run("python", str(ROOT / ".ci" / "matrix_table.py"), str(RESULTS))
