"""The outbox steps of bench/storage.py (its docstring says what they measure)."""

from __future__ import annotations

import datetime as dt
import os
import time

import psycopg


def rate(count: int, seconds: float) -> float:
    return count / seconds


def run(url: str, *, rows: int, fresh: int, publish: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(PLAIN_OUTBOX)
    outbox_publish(url, publish)
    outbox_relay(url, rows, fresh)


FIRST_PUBLISH = "pgtrigger_pgmsg_outbox_first_publish_4e47b"
PLAIN_OUTBOX = """
CREATE TABLE IF NOT EXISTS bench_outbox_plain
    (LIKE pgmsg_outbox_message INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE bench_outbox_plain ALTER COLUMN id SET DEFAULT nextval('pgmsg_outbox_message_id_seq');
CREATE UNIQUE INDEX IF NOT EXISTS bench_outbox_plain_unique
    ON bench_outbox_plain (outbox, message_id);
CREATE INDEX IF NOT EXISTS bench_outbox_plain_pending ON bench_outbox_plain (outbox, id)
    WHERE status = 'pending';
ALTER TABLE bench_outbox_plain SET (autovacuum_enabled = false);
"""
OUTBOX_COLUMNS = "(outbox, message_id, destination, topic, type, key, payload)"
OUTBOX_ROWS = (
    "SELECT 'test.recorded', %(prefix)s || g, 'recorder', 'o', 't', 'k' || (g %% 100), "
    "'{\"n\": 1}'::jsonb FROM generate_series(1, %(n)s) AS g"
)


def outbox_publish(url: str, n: int) -> None:
    from django.db import transaction

    import pgmsg
    from pgmsg_tests.testapp import outbox_declarations as decl

    def raw(table: str, per_tx: int, conflict: str) -> float:
        with psycopg.connect(url, autocommit=True) as conn:
            t = time.perf_counter()
            for i in range(n // per_tx):
                conn.execute(
                    f"INSERT INTO {table} {OUTBOX_COLUMNS} {OUTBOX_ROWS} {conflict}",
                    {"prefix": f"{table}-{per_tx}-{i}-", "n": per_tx},
                )
            return rate(n, time.perf_counter() - t)

    def mine(per_tx: int) -> float:
        t = time.perf_counter()
        for i in range(n // per_tx):
            with transaction.atomic():
                if per_tx == 1:
                    pgmsg.publish("test.recorded", {"n": 1}, type="t", key=f"k{i % 100}")
                else:
                    pgmsg.publish_many(
                        (decl.OrderPlaced(order_id=j, total=1), {"key": f"k{j % 100}"})
                        for j in range(per_tx)
                    )
        return rate(n, time.perf_counter() - t)

    print(f"\n== outbox publish, {n:,} messages each (load {os.getloadavg()[0]:.2f})")
    print(f"  {'':<44} {'msg/s':>9} {'vs plain+unique':>16}")
    for per_tx in (1, 100):
        old = raw("bench_outbox_plain", per_tx, "ON CONFLICT (outbox, message_id) DO NOTHING")
        new = raw("pgmsg_outbox_message", per_tx, "")
        ours = mine(per_tx)
        print(f"  {f'raw INSERT, plain table + unique, {per_tx}/tx':<44} {old:>9,.0f}")
        print(
            f"  {f'raw INSERT, partitioned + trigger, {per_tx}/tx':<44} {new:>9,.0f} "
            f"{new / old:>16.2f}"
        )
        print(f"  {f'pgmsg publish, {per_tx}/tx':<44} {ours:>9,.0f} {ours / old:>16.2f}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE bench_outbox_plain, pgmsg_outbox_message")


def outbox_relay(url: str, rows: int, fresh: int) -> None:
    from pgmsg.core import partitions
    from pgmsg.core.worker import Worker
    from pgmsg.outbox import partitions as outbox_partitions

    week = partitions.week_start(dt.datetime.now(dt.UTC)) - 2 * partitions.WEEK
    name = partitions.week_name("pgmsg_outbox_message", week)

    def relay() -> float:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                f"INSERT INTO pgmsg_outbox_message {OUTBOX_COLUMNS} {OUTBOX_ROWS}",
                {"prefix": f"fresh-{time.monotonic()}-", "n": fresh},
            )
        worker = Worker(outboxes=["test.recorded"], until_idle=True,
                        install_signal_handlers=False, batch_size=100)  # fmt: skip
        t = time.perf_counter()
        worker.run()
        assert worker.handled == fresh, worker.handled
        return rate(fresh, time.perf_counter() - t)

    def raw_loop(conn) -> float:
        conn.execute(
            f"INSERT INTO bench_outbox_plain {OUTBOX_COLUMNS} {OUTBOX_ROWS}",
            {"prefix": f"fresh-{time.monotonic()}-", "n": fresh},
        )
        t = time.perf_counter()
        done = 0
        while done < fresh:
            with conn.transaction():
                claimed = conn.execute(
                    "SELECT id FROM bench_outbox_plain WHERE outbox = 'test.recorded' "
                    "AND status = 'pending' ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED"
                )
                ids = [r[0] for r in claimed]
                conn.execute("DELETE FROM bench_outbox_plain WHERE id = ANY(%s)", [ids])
            done += len(ids)
        return rate(fresh, time.perf_counter() - t)

    with psycopg.connect(url, autocommit=True) as conn:
        with conn.transaction(), conn.cursor() as cur:
            if name not in {p.name for p in partitions.partitions(cur, outbox_partitions.TABLE)}:
                partitions.create(cur, outbox_partitions.TABLE, name, week, week + partitions.WEEK)
        conn.execute(f"ALTER TABLE {name} SET (autovacuum_enabled = false)")
        raw_clean = raw_loop(conn)
        # The outage's rows, in a past week (and in the plain table), then deleted; loaded with
        # the first-publish trigger off (the ids are new by construction).
        conn.execute(f"ALTER TABLE pgmsg_outbox_message DISABLE TRIGGER {FIRST_PUBLISH}")
        conn.execute(
            "INSERT INTO pgmsg_outbox_message (outbox, message_id, destination, topic, type, "
            "key, payload, created_at) SELECT 'test.recorded', 'outage-' || g, 'recorder', 'o', "
            "'t', 'k' || (g %% 100), '{}', %s FROM generate_series(1, %s) AS g",
            [week + dt.timedelta(days=1), rows],
        )
        conn.execute(f"ALTER TABLE pgmsg_outbox_message ENABLE TRIGGER {FIRST_PUBLISH}")
        conn.execute(f"INSERT INTO bench_outbox_plain {OUTBOX_COLUMNS} {OUTBOX_ROWS}",
                     {"prefix": "outage-", "n": rows})  # fmt: skip
        conn.execute("ANALYZE pgmsg_outbox_message")
        conn.execute("ANALYZE bench_outbox_plain")
        conn.execute("DELETE FROM pgmsg_outbox_message WHERE message_id LIKE 'outage-%'")
        conn.execute("DELETE FROM bench_outbox_plain WHERE message_id LIKE 'outage-%'")
        raw_bloated = raw_loop(conn)
    # The relay's own periodic pass would drop the week at its first batch: kept off here, to
    # measure the relay with the deleted rows still behind it.
    maybe_run = outbox_partitions.Maintenance.maybe_run
    outbox_partitions.Maintenance.maybe_run = lambda self: None  # type: ignore[method-assign]
    relay_bloated = relay()
    outbox_partitions.Maintenance.maybe_run = maybe_run  # type: ignore[method-assign]
    t = time.perf_counter()
    dropped = outbox_partitions.drop_emptied()
    drop_seconds = time.perf_counter() - t
    assert name in dropped, dropped
    relay_after = relay()
    with psycopg.connect(url, autocommit=True) as conn:
        raw_clean_again = raw_loop(conn)
        t = time.perf_counter()
        conn.execute("VACUUM bench_outbox_plain")
        vacuum_seconds = time.perf_counter() - t
    ceiling = (raw_clean + raw_clean_again) / 2
    print(f"\n== outbox relay, {fresh:,} fresh messages, {rows:,} relayed rows behind "
          f"(load {os.getloadavg()[0]:.2f})")  # fmt: skip
    print(f"  {'':<52} {'msg/s':>9} {'vs raw clean':>13}")
    print(f"  {'raw claim+DELETE, plain table, clean (mean of 2)':<52} {ceiling:>9,.0f}")
    print(f"  {'raw claim+DELETE, plain table, deleted rows behind':<52} {raw_bloated:>9,.0f} "
          f"{raw_bloated / ceiling:>13.2f}")  # fmt: skip
    print(f"  {'pgmsg relay, deleted rows in a past week':<52} {relay_bloated:>9,.0f} "
          f"{relay_bloated / ceiling:>13.2f}")  # fmt: skip
    print(f"  {'pgmsg relay, after that week was dropped':<52} {relay_after:>9,.0f} "
          f"{relay_after / ceiling:>13.2f}")  # fmt: skip
    print(
        f"  drop_emptied() {drop_seconds:.2f} s; VACUUM of the plain table {vacuum_seconds:.2f} s"
    )
