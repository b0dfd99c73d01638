"""Benchmark: storage at scale. The event store at growing sizes, and inbox retention by
partition drop next to DELETE of the same rows.

At each size (events already stored; default 0, 1M and 10M) it prints: append rate (1 and
100 events per transaction), read_stream() latency p50/p99 of a stream in the middle of the
store, a subscription's catch-up rate over freshly appended events, and the event table's
size with its indexes; beside each, the raw ceiling measured in the same step (plain psycopg
INSERT into a small plain table, the same SELECT without pgmsg's Python, a keyset SELECT),
and the ratio. Stored events are spread over the past months (one monthly partition per
month), as a store that has run for a while; they are loaded with INSERT ... SELECT
generate_series, the first-append trigger off for the load (no message id repeats) and the
keys it would have written loaded beside them.

Then it loads --inbox processed inbox messages into one past week and times retention by
partition (pgmsg.inbox.retention.drop_expired) and, on the same rows loaded again, DELETE.

Then the outbox (--outbox N relayed rows, --fresh M): publish rates, 1 and 100 messages per
transaction, of pgmsg.publish()/publish_many() next to the raw INSERT of the same rows into
the partitioned table (its first-publish trigger: the dedupe design) and into a plain table
with the unique (outbox, message_id) and ON CONFLICT DO NOTHING (the layout before 0016);
then the aftermath of a broker outage: N rows written into a past week and deleted (as the
relay's acks delete them; autovacuum off for those tables, as before VACUUM caught up), the
in-process relay's rate over M fresh messages with them behind, the time of
pgmsg.outbox.partitions.drop_emptied(), the relay's rate again; beside them a raw claim and
DELETE loop (psycopg, 100 per transaction) on a plain table of the same shape, clean and with
the same N deleted rows behind, and the VACUUM that the plain table then needs.

    python bench/storage.py [--sizes 0,1000000,10000000] [--inbox 1000000]
                            [--outbox 1000000] [--fresh 5000]

Uses DATABASE_URL's server (or the embedded default) and a scratch database
`pgmsg_bench_storage` that it drops and re-creates; nothing else is touched.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common, outbox_storage  # noqa: E402

SCRATCH_DB = "pgmsg_bench_storage"
#: Events per stored stream.
PER_STREAM = 10
#: Months the stored events are spread over.
MONTHS = 12
FIRST_APPEND = "pgtrigger_pgmsg_event_first_append_23729"
FIRST_RECEIPT = "pgtrigger_pgmsg_inbox_first_receipt_9326c"


def declare():
    import pgmsg
    from pgmsg.events import store

    if "bench.tick" in store.event_types:
        return store.event_types["bench.tick"], declare.counted

    class Tick(pgmsg.Event, type="bench.tick"):
        n: int

    counted = {"n": 0}
    sub = pgmsg.Subscription("bench-storage", category="tail", partitions=1)
    sub.handler(Tick)(lambda recorded: counted.__setitem__("n", counted["n"] + 1))
    declare.counted = counted
    return Tick, counted


def month_start(offset: int) -> dt.datetime:
    today = dt.datetime.now(dt.UTC)
    index = today.year * 12 + today.month - 1 + offset
    return dt.datetime(index // 12, index % 12 + 1, 1, tzinfo=dt.UTC)


def make_month_partitions(conn) -> None:
    from pgmsg.core import partitions

    with conn.cursor() as cur:
        existing = {p.name for p in partitions.partitions(cur, "pgmsg_event")}
        for offset in range(-MONTHS, 0):
            start = month_start(offset)
            name = f"pgmsg_event_p{start:%Y%m}"
            if name not in existing:
                partitions.create(cur, "pgmsg_event", name, start, month_start(offset + 1))


def load_events(url: str, start: int, stop: int, total: int) -> float:
    """Events start..stop-1 of the final ``total``, spread evenly over the past MONTHS months;
    returns seconds."""
    t = time.perf_counter()
    oldest = month_start(-MONTHS)
    span = (month_start(0) - oldest).total_seconds() - 3600
    with psycopg.connect(url, autocommit=True) as conn:
        # A worker of an earlier step sealed the past months (pgmsg/events/partitions.py),
        # which then refuse new rows: this load writes history, so it lifts the seals (the
        # next worker seals the months again).
        for (statement,) in conn.execute(
            "SELECT format('ALTER TABLE %I DROP CONSTRAINT %I', c.relname, s.conname) "
            "FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid "
            "JOIN pg_constraint AS s ON s.conrelid = c.oid "
            "WHERE i.inhparent = 'pgmsg_event'::regclass "
            "AND s.conname LIKE 'pgmsg\\_sealed\\_below\\_%%'"
        ).fetchall():
            conn.execute(statement)
        conn.execute(f"ALTER TABLE pgmsg_event DISABLE TRIGGER {FIRST_APPEND}")
        for chunk in range(start, stop, 1_000_000):
            end = min(stop, chunk + 1_000_000)
            conn.execute(
                "INSERT INTO pgmsg_event (stream_name, category, version, type, data, metadata, "
                "message_id, recorded_at) "
                "SELECT 'fill-' || (g / %(per)s), 'fill', g %% %(per)s + 1, 'bench.tick', "
                "jsonb_build_object('n', g), '{}', md5(g::text)::uuid, "
                "%(oldest)s::timestamptz + make_interval(secs => %(span)s * g / %(total)s) "
                "FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS g",
                {"per": PER_STREAM, "oldest": oldest, "span": span, "total": total,
                 "lo": chunk, "hi": end},
            )  # fmt: skip
            conn.execute(  # what the trigger would have written
                "INSERT INTO pgmsg_event_key (message_id) SELECT md5(g::text)::uuid "
                "FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS g",
                {"lo": chunk, "hi": end},
            )
        conn.execute(f"ALTER TABLE pgmsg_event ENABLE TRIGGER {FIRST_APPEND}")
        conn.execute("VACUUM ANALYZE pgmsg_event")
        conn.execute("VACUUM ANALYZE pgmsg_event_key")
        # Flush the load's dirty pages now: the steps measure a store that has run for a while,
        # not one whose bulk write is still being checkpointed under the appends (timed after
        # a 10M load without it, 100-event appends ran 37 % slower for the first minutes).
        conn.execute("CHECKPOINT")
    return time.perf_counter() - t


def rate(count: int, seconds: float) -> float:
    return count / seconds


def appends(url: str, label: str, n: int, batches: int) -> dict:
    import pgmsg

    Tick, _ = declare()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS raw_append (id bigserial PRIMARY KEY, stream text, "
            "version int, data jsonb, UNIQUE (stream, version))"
        )
        t = time.perf_counter()
        for i in range(n):
            conn.execute(
                "INSERT INTO raw_append (stream, version, data) VALUES (%s, 1, %s)",
                [f"{label}-r1-{i}", json.dumps({"n": i})],
            )
        raw1 = rate(n, time.perf_counter() - t)
        t = time.perf_counter()
        for b in range(batches):
            with conn.transaction():
                conn.cursor().executemany(
                    "INSERT INTO raw_append (stream, version, data) VALUES (%s, %s, %s)",
                    [(f"{label}-r100-{b}", v, json.dumps({"n": v})) for v in range(1, 101)],
                )
        raw100 = rate(batches * 100, time.perf_counter() - t)
    t = time.perf_counter()
    for i in range(n):
        pgmsg.append(f"app{label}-{i}", Tick(n=i))
    ours1 = rate(n, time.perf_counter() - t)
    t = time.perf_counter()
    for b in range(batches):
        pgmsg.append(f"bat{label}-{b}", [Tick(n=v) for v in range(100)])
    ours100 = rate(batches * 100, time.perf_counter() - t)
    return {"append1": (ours1, raw1), "append100": (ours100, raw100)}


def stream_reads(url: str, stored: int, reads: int) -> dict:
    import pgmsg

    if stored == 0:
        return {}
    stream = f"fill-{stored // PER_STREAM // 2}"
    ours, raw = [], []
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(reads):
            t = time.perf_counter()
            conn.execute(
                "SELECT position, transaction_id::text, stream_name, version, type, data::text, "
                "metadata::text, message_id, recorded_at FROM pgmsg_event "
                "WHERE stream_name = %s AND version >= 1 ORDER BY version",
                [stream],
            ).fetchall()
            raw.append(time.perf_counter() - t)
            t = time.perf_counter()
            events = pgmsg.read_stream(stream)
            ours.append(time.perf_counter() - t)
            assert len(events) == PER_STREAM, len(events)
    return {"read_stream": (quantiles(ours), quantiles(raw))}


def quantiles(samples: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples, n=100)
    return cuts[49] * 1000, cuts[98] * 1000


def catch_up(url: str, label: str, count: int) -> dict:
    import pgmsg
    from pgmsg.core.worker import Worker

    Tick, counted = declare()
    for start in range(0, count, 1000):
        pgmsg.append(f"tail-{label}-{start}", [Tick(n=n) for n in range(1000)])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS raw_tail")
        conn.execute(
            "CREATE TABLE raw_tail AS SELECT position AS id, stream_name, version, type, data, "
            "metadata FROM pgmsg_event WHERE stream_name LIKE %s",
            [f"tail-{label}-%"],
        )
        conn.execute("ALTER TABLE raw_tail ADD PRIMARY KEY (id)")
        t, last, seen = time.perf_counter(), 0, 0
        while rows := conn.execute(
            "SELECT id, stream_name, version, type, data::text, metadata::text FROM raw_tail "
            "WHERE id > %s ORDER BY id LIMIT 1000",
            [last],
        ).fetchall():
            for row in rows:
                json.loads(row[4])
            seen += len(rows)
            last = rows[-1][0]
        raw = rate(seen, time.perf_counter() - t)
    counted["n"] = 0
    t = time.perf_counter()
    Worker(
        subscriptions=["bench-storage"], until_idle=True, install_signal_handlers=False,
        batch_size=1000,
    ).run()  # fmt: skip
    ours = rate(counted["n"], time.perf_counter() - t)
    assert counted["n"] == count, counted
    return {"catch_up": (ours, raw)}


def sizes(url: str) -> tuple[int, int]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT sum(pg_table_size(relid)), sum(pg_indexes_size(relid)) FROM "
            "(SELECT relid FROM pg_partition_tree('pgmsg_event') "
            "UNION ALL SELECT 'pgmsg_event_key'::regclass) AS t"
        ).fetchone()


def step(url: str, stored: int, args) -> dict:
    label = str(stored)
    result = {}
    result.update(appends(url, label, args.appends, args.batches))
    result.update(stream_reads(url, stored, args.reads))
    result.update(catch_up(url, label, args.catchup))
    result["size"] = sizes(url)
    return result


def show(stored: int, result: dict) -> None:
    load = os.getloadavg()
    print(f"\n== {stored:,} events stored (load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})")
    for key, text in (
        ("append1", "append, 1 event/tx"),
        ("append100", "append, 100 events/tx"),
        ("catch_up", "subscription catch-up, batch 1000"),
    ):
        ours, raw = result[key]
        print(f"  {text:<40} {ours:>10,.0f}/s   raw {raw:>10,.0f}/s   ratio {ours / raw:.2f}")
    if "read_stream" in result:
        (p50, p99), (r50, r99) = result["read_stream"]
        print(
            f"  {'read_stream (10 events), ms p50/p99':<40} {p50:>6.2f} / {p99:<6.2f}  "
            f"raw {r50:.2f} / {r99:.2f}   ratio p50 {p50 / r50:.2f}"
        )
    table, indexes = result["size"]
    print(
        f"  {'tables (+ keys) + indexes':<40} {table / 2**20:,.0f} MB + {indexes / 2**20:,.0f} MB"
    )


def inbox_retention(url: str, rows: int) -> None:
    from pgmsg.core import partitions
    from pgmsg.inbox import retention

    week = partitions.week_start(dt.datetime.now(dt.UTC)) - 3 * partitions.WEEK
    name = partitions.week_name("pgmsg_inbox_message", week)

    def load() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            with conn.transaction(), conn.cursor() as cur:
                if name not in {p.name for p in partitions.partitions(cur, retention.TABLE)}:
                    partitions.create(cur, retention.TABLE, name, week, week + partitions.WEEK)
            conn.execute(f"ALTER TABLE pgmsg_inbox_message DISABLE TRIGGER {FIRST_RECEIPT}")
            conn.execute(
                "INSERT INTO pgmsg_inbox_message (inbox, message_id, type, payload, status, "
                "received_at, processed_at) SELECT 'bench.inbox', 'm-' || g, 'work', "
                "jsonb_build_object('n', g), 'processed', "
                "%(week)s::timestamptz + make_interval(secs => g %% 500000), "
                "%(week)s::timestamptz + make_interval(secs => g %% 500000 + 1) "
                "FROM generate_series(1, %(rows)s) AS g",
                {"week": week, "rows": rows},
            )
            conn.execute(f"ALTER TABLE pgmsg_inbox_message ENABLE TRIGGER {FIRST_RECEIPT}")
            conn.execute("VACUUM ANALYZE pgmsg_inbox_message")

    load()
    t = time.perf_counter()
    removed = retention.drop_expired()
    by_partition = time.perf_counter() - t
    assert removed["processed"] == rows, removed
    load()
    with psycopg.connect(url, autocommit=True) as conn:
        t = time.perf_counter()
        deleted = conn.execute(
            "DELETE FROM pgmsg_inbox_message WHERE status = 'processed' "
            "AND processed_at < now() - interval '72 hours'"
        ).rowcount
        by_delete = time.perf_counter() - t
    assert deleted == rows, deleted
    load_avg = os.getloadavg()
    print(f"\n== inbox retention of {rows:,} processed messages (load {load_avg[0]:.2f})")
    print(f"  by partition (drop_expired)   {by_partition:8.2f} s")
    print(
        f"  DELETE of the same rows       {by_delete:8.2f} s   ratio {by_partition / by_delete:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0,1000000,10000000")
    parser.add_argument("--appends", type=int, default=500)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--reads", type=int, default=300)
    parser.add_argument("--catchup", type=int, default=20_000)
    parser.add_argument("--inbox", type=int, default=1_000_000)
    parser.add_argument("--outbox", type=int, default=1_000_000, help="relayed rows behind")
    parser.add_argument("--fresh", type=int, default=5_000, help="messages relayed per step")
    parser.add_argument("--publish", type=int, default=2_000, help="messages per publish step")
    args = parser.parse_args()
    targets = [int(s) for s in args.sizes.split(",") if s]  # "": no event steps
    url = common.scratch_url(SCRATCH_DB)
    common.django_setup(url)
    with psycopg.connect(url, autocommit=True) as conn:
        make_month_partitions(conn)
    print(f"pgmsg storage bench on {url.rsplit('@', 1)[-1]}")
    stored = 0
    for target in targets:
        if target > stored:
            seconds = load_events(url, stored, target, targets[-1])
            print(f"\n(loaded {target - stored:,} events in {seconds:.0f} s)")
            stored = target
        show(stored, step(url, stored, args))
    if args.inbox:
        inbox_retention(url, args.inbox)
    if args.outbox:
        outbox_storage.run(url, rows=args.outbox, fresh=args.fresh, publish=args.publish)


if __name__ == "__main__":
    main()
