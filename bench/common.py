"""What every bench script shares: a scratch database on the chosen server, and Django on it."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent


def scratch_url(name: str) -> str:
    """Drop and re-create database ``name`` on DATABASE_URL's server (or the embedded one).

    ``PGMSG_BENCH_DB_SUFFIX`` is appended to the name: two checkouts benchmarking on one
    shared server must not drop each other's scratch databases."""
    from pgmsg_dev.devdb import database_url, default_database

    name += os.environ.get("PGMSG_BENCH_DB_SUFFIX", "")

    base = default_database(ROOT / ".pgdata")  # starts the embedded server when no URL
    with psycopg.connect(database_url(base, name="postgres"), autocommit=True) as conn:
        # A slot left by an interrupted run (the outbox's logical mode) would block the drop.
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE database = %s",
            [name],
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return database_url(base, name=name)


def django_setup(url: str, settings: str = "pgmsg_tests.settings", migrate: bool = True) -> None:
    """Configure Django on ``url`` (child processes inherit it) and migrate."""
    os.environ["DATABASE_URL"] = url
    # The test settings' database for the outbox's logical mode: this one too (no private
    # embedded server, see pgmsg_tests/settings.py).
    os.environ["PGMSG_LOGICAL_DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = settings
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0)


def spread(values: list[float], fmt: str = ">9,.0f") -> str:
    """min, median and max of repeated measurements, formatted alike."""
    return " ".join(format(v, fmt) for v in (min(values), statistics.median(values), max(values)))


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user and system) process ``pid`` has used, from /proc; None where there is
    none (not Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_us_per(pid: int, started: float | None, count: int) -> float | None:
    """Microseconds of CPU process ``pid`` used per item since ``started`` (its cpu_seconds
    then), over ``count`` items; None where /proc does not say."""
    now = cpu_seconds(pid)
    if started is None or now is None:
        return None
    return (now - started) / count * 1e6


def wait_listening(url: str, query: str) -> None:
    """Until a session of ``url``'s database runs ``query`` (a LISTEN), 60 s at most."""
    deadline = time.time() + 60
    with psycopg.connect(url, autocommit=True) as conn:
        while not conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = "
            "current_database() AND query = %s",
            [query],
        ).fetchone()[0]:
            if time.time() > deadline:
                raise SystemExit(f"no session ran {query!r} within 60 s")
            time.sleep(0.05)
