"""Benchmark: where one notify() call's cost goes, next to a plain INSERT, one producer.

With no worker idle, notify() sends no NOTIFY, so its gap to a plain INSERT is cost per call.
This splits it: client CPU (this Python process) and server CPU (the backend serving it, from
/proc) per call, for a ladder of variants from a plain INSERT to pgmsg.notify(): the plain
INSERT prepared (psycopg's default, the ceiling of bench/wakeups.py) and not (Django's
default), then pgmsg_notification's columns and indexes, its insert in a PL/pgSQL function,
pgmsg_send's wake check, pgmsg_send() itself on the table (no trigger since migration 0028),
each prepared; then pgmsg_send() not prepared (as notify() sends it where
PGMSG["PREPARE_STATEMENTS"] is off), its steps written out in one prepared statement (as
notify() sends it by default), an SQL producer's INSERT (created_at's default wakes), Django's
cursor wrapper (which notify() skips unless asked), and notify() itself, prepared and not.
synchronous_commit is off in these sessions so that the figures are CPU, not waiting for the
WAL flush. With 2 cores and 8 or more producers the machine is CPU-bound,
so the ratio of these sums is about the ratio of commit rates there.

    python bench/notify_cost.py [--calls 5000] [--reps 3]

Needs the server on this machine (it reads the backends' CPU time from /proc). Uses
DATABASE_URL's server (or the embedded default) and a scratch database that it drops and
re-creates; nothing else is touched.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402

SCRATCH_DB = "pgmsg_bench_notify_cost"

# Copies of pgmsg_notification with less on them, the plain table of bench/wakeups.py, and
# pgmsg_send's insert in a function of its own, without and with its wake check (migration
# 0028's pgmsg_send on the copy). The copies' created_at defaults to the statement's timestamp
# without the wake that pgmsg_notification's default adds (migration 0028).
SCHEMA = """
CREATE TABLE raw_plain (id bigserial PRIMARY KEY, channel text NOT NULL, payload jsonb NOT NULL);
CREATE TABLE copy_pkey_only (LIKE pgmsg_notification INCLUDING DEFAULTS INCLUDING IDENTITY);
ALTER TABLE copy_pkey_only ADD PRIMARY KEY (id);
CREATE TABLE copy_no_trigger (LIKE pgmsg_notification INCLUDING ALL);
ALTER TABLE copy_pkey_only ALTER COLUMN created_at SET DEFAULT statement_timestamp();
ALTER TABLE copy_no_trigger ALTER COLUMN created_at SET DEFAULT statement_timestamp();
CREATE FUNCTION copy_insert(channel_name text, payload_text text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE sent bigint;
BEGIN
    INSERT INTO copy_no_trigger (channel, payload)
    VALUES (channel_name, payload_text::jsonb) RETURNING id INTO sent;
    RETURN sent;
END $$;
"""
COPY_SEND = (
    importlib.import_module("pgmsg.migrations.0028_notification_wake_in_default")
    .SEND_FUNCTIONS.split("CREATE OR REPLACE FUNCTION pgmsg_send_many")[0]
    .replace("FUNCTION pgmsg_send(", "FUNCTION copy_send(")
    .replace("INSERT INTO pgmsg_notification", "INSERT INTO copy_no_trigger")
)
TABLES = "raw_plain, copy_pkey_only, copy_no_trigger, pgmsg_notification"


def backend_cpu(pid: int) -> float:
    """Seconds of CPU the server process ``pid`` has used (/proc/<pid>/schedstat: nanoseconds;
    /proc/<pid>/stat counts 10 ms ticks, too coarse for a few thousand calls)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    url = common.scratch_url(SCRATCH_DB)
    common.django_setup(url, "bench.settings")
    from django.db import connection

    import pgmsg
    from bench.benchapp.listeners import Tick
    from pgmsg.channels import sending
    from pgmsg.core.wire import protocol

    raw = psycopg.connect(url, autocommit=True)  # prepares a statement on its 5th use
    raw.execute(SCHEMA)
    raw.execute(COPY_SEND)
    unprepared = psycopg.connect(url, autocommit=True, prepare_threshold=None)
    for conn in (raw, unprepared):
        conn.execute("SET synchronous_commit = off")
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")
    django_pid = connection.connection.info.backend_pid
    server = raw.execute("SHOW server_version").fetchone()[0]

    payload = json.dumps({"seq": 0, "ts": 0.0})
    params = {"channel": "bench.tick", "payload": payload}
    plain = "INSERT INTO raw_plain (channel, payload) VALUES ('bench.tick', %s)"

    def insert(table: str) -> str:
        return (
            f"INSERT INTO {table} (channel, payload) VALUES (%(channel)s, %(payload)s::jsonb) "
            "RETURNING id"
        )

    def call_of(function: str) -> str:
        return f"SELECT {function}(%(channel)s, %(payload)s)"

    def libpq_send() -> None:
        protocol.one_value(unprepared, sending._SEND.libpq, [params["channel"], payload])

    def libpq_send_prepared() -> None:
        values = [params["channel"], payload]
        protocol.one_value(unprepared, sending._SEND.prepared, values, prepare=True)

    def unprepared_settings():
        # PREPARE_STATEMENTS off for the variant's calls, set around them (not per call: a
        # settings change makes notify() check its connection afresh, wire.send).
        from django.conf import settings
        from django.test import override_settings

        return override_settings(PGMSG={**settings.PGMSG, "PREPARE_STATEMENTS": False})

    def django_send() -> None:
        with connection.cursor() as cursor:
            cursor.execute(call_of("pgmsg_send"), params)
            cursor.fetchone()

    raw_pid, unprepared_pid = raw.info.backend_pid, unprepared.info.backend_pid
    ladder = [
        (
            "plain INSERT, 1 index (bench/wakeups.py's ceiling)",
            raw_pid,
            lambda: raw.execute(plain, [payload]),
        ),
        (
            "the same, not prepared (as Django's default sends)",
            unprepared_pid,
            lambda: unprepared.execute(plain, [payload]),
        ),
        (
            "+ pgmsg_notification's columns, RETURNING id",
            raw_pid,
            lambda: raw.execute(insert("copy_pkey_only"), params).fetchone(),
        ),
        (
            "+ its two other indexes",
            raw_pid,
            lambda: raw.execute(insert("copy_no_trigger"), params).fetchone(),
        ),
        (
            "+ the insert in a PL/pgSQL function",
            raw_pid,
            lambda: raw.execute(call_of("copy_insert"), params).fetchone(),
        ),
        (
            "+ pgmsg_send's wake check (pgmsg_send() on the copy)",
            raw_pid,
            lambda: raw.execute(call_of("copy_send"), params).fetchone(),
        ),
        (
            "pgmsg_send() on pgmsg_notification (no trigger: 0028)",
            raw_pid,
            lambda: raw.execute(call_of("pgmsg_send"), params).fetchone(),
        ),
        (
            "the same, not prepared, through libpq (PREPARE_STATEMENTS False)",
            unprepared_pid,
            libpq_send,
        ),
        (
            "its steps written out, prepared, through libpq (as notify())",
            unprepared_pid,
            libpq_send_prepared,
        ),
        (
            "an SQL producer's INSERT (created_at's default wakes)",
            raw_pid,
            lambda: raw.execute(insert("pgmsg_notification"), params).fetchone(),
        ),
        ("pgmsg_send() through Django's cursor wrapper", django_pid, django_send),
        ("pgmsg.notify()", django_pid, lambda: pgmsg.notify(Tick(seq=1))),
        (
            "pgmsg.notify(), PREPARE_STATEMENTS False",
            django_pid,
            lambda: pgmsg.notify(Tick(seq=1)),
            unprepared_settings,
        ),
    ]
    results: dict[str, list[tuple[float, float]]] = {}
    for _ in range(args.reps):
        for label, pid, call, *context in ladder:
            raw.execute(f"TRUNCATE {TABLES}")
            with context[0]() if context else contextlib.nullcontext():
                for _ in range(200):  # warm up (psycopg prepares a statement on its 5th use)
                    call()
                client, backend = time.process_time(), backend_cpu(pid)
                for _ in range(args.calls):
                    call()
                client = (time.process_time() - client) / args.calls * 1e6
                backend = (backend_cpu(pid) - backend) / args.calls * 1e6
            results.setdefault(label, []).append((client, backend))

    print(
        f"notify() cost per call, one producer, no worker: PostgreSQL {server}, "
        f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M %Z')}, load average "
        f"{os.getloadavg()[0]:.1f}; {args.calls} calls x {args.reps} reps, lowest shown; "
        f"Django OPTIONS prepare_threshold={connection.connection.prepare_threshold}"
    )
    print(f"\n{'variant':<62} {'client us':>9} {'server us':>9} {'sum':>6} {'vs plain':>8}")
    plain = None
    for label, runs in results.items():
        client = min(c for c, _ in runs)
        backend = min(b for _, b in runs)
        plain = plain or client + backend
        print(
            f"{label:<62} {client:>9.1f} {backend:>9.1f} {client + backend:>6.1f} "
            f"{plain / (client + backend):>8.2f}"
        )


if __name__ == "__main__":
    main()
