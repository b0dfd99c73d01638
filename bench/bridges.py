"""Benchmark: inbox bridges per broker, next to a raw client loop of the same broker.

For each broker that listens on 127.0.0.1 (RabbitMQ, NATS JetStream, Redis Streams, Mosquitto):

- raw: the client library the bridge uses consumes a prefilled backlog of N messages (pgmsg's
  headers, a small JSON body) in batches of 100, INSERTs each batch into a table in one
  statement and transaction, commits, and acknowledges the broker (RabbitMQ: prefetch 1000 and
  one multiple ack; JetStream: a durable pull consumer, fetch 100, ack each; Redis: XREADGROUP
  COUNT 100, XACK; MQTT: QoS 1, manual PUBACKs). Nothing else.
- bridge: the same backlog, refilled, drained by the bridge (a worker running only it, in a
  thread of this process, --batch-size 100) into an inbox: the rate is N over the time from the
  worker's start until the inbox holds N messages.
- rounds (--rounds, default 3): raw then bridge, each on a backlog of its own, that many
  times; the medians are printed, and each round's ratio.
- inbox alone: receive_many() of prebuilt batches of 100, no broker, the same rounds: what
  storing costs any bridge.
- latency: one relay process (``listen --outbox``), one bridge process (``listen --bridge``)
  and one inbox worker (``listen --inbox``); M messages (default 200), one at a time: from the
  producer's COMMIT returning until the handler's transaction started (the inbox message's
  processed_at, the start of the transaction that ran its handler); p50 and p99, after 5
  messages of warm-up, on an inbox emptied of what the throughput part stored.

MQTT: Mosquitto keeps at most 1,000 messages (its max_queued_messages default) for a session
that is not connected, so its backlog is min(N, 900).

    python bench/bridges.py [--n 5000] [--latency-n 200] [--rounds 3]
                            [--brokers redis,amqp,nats,mqtt] [--parts throughput,latency,alone]

BENCH_SLOW=1 prints each latency sample over 100 ms with its times (stored in B: the bridge's
transaction start; visible: when this script first saw the row). BENCH_PROFILE=/tmp/prof
writes the drain worker's cProfile statistics to /tmp/prof.<broker>.

Uses DATABASE_URL's server (or the embedded default) and a scratch database
``pgmsg_bench_bridges`` that it drops and re-creates; on the brokers, names of its own
(``bridges-<random>``), removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402

SCRATCH_DB = "pgmsg_bench_bridges"
SETTINGS = "bench.settings"
BATCH = 100
KEYS = 100
INBOX = "test.bridged"
BODY = '{{"n": {n}, "note": "bench"}}'
WARM_UP = 5


def headers(n: int, run: str) -> dict[str, str]:
    return {
        "pgmsg-message-id": f"{run}-{n}",
        "pgmsg-type": "tick",
        "pgmsg-outbox": "bench",
        "pgmsg-key": f"k{n % KEYS}",
    }


def prefill(place, n: int, run: str) -> None:
    for i in range(n):
        place.send(BODY.format(n=i).encode(), headers(i, run))
    time.sleep(0.5)  # MQTT and JetStream route asynchronously


# -- the raw loops ------------------------------------------------------------------------


def insert(conn: psycopg.Connection, rows: list[tuple[str, bytes]]) -> None:
    with conn.transaction():
        conn.execute(
            "INSERT INTO bench_raw (message_id, body) "
            "SELECT * FROM unnest(%s::text[], %s::text[]::jsonb[])",
            [[r[0] for r in rows], [r[1].decode() for r in rows]],
        )


def raw_redis(place, conn, n: int) -> None:
    client = place.client
    client.xgroup_create(place.topic, "raw", id="0")
    done = 0
    while done < n:
        found = client.xreadgroup("raw", "raw", {place.topic: ">"}, count=BATCH)
        entries = found[0][1] if found else []
        rows = [(json.loads(f[b"headers"])["pgmsg-message-id"], f[b"payload"]) for _, f in entries]
        insert(conn, rows)
        client.xack(place.topic, "raw", *[entry_id for entry_id, _ in entries])
        done += len(entries)


def raw_amqp(place, conn, n: int) -> None:
    channel = place.channel
    channel.basic_qos(prefetch_count=1000)
    done = 0
    batch: list = []
    for method, properties, body in channel.consume(place.topic, inactivity_timeout=0.05):
        if method is not None:
            batch.append((method.delivery_tag, properties.headers["pgmsg-message-id"], body))
        if batch and (len(batch) >= BATCH or method is None):
            insert(conn, [(mid, body) for _, mid, body in batch])
            channel.basic_ack(batch[-1][0], multiple=True)
            done += len(batch)
            batch = []
        if done >= n:
            break
    channel.cancel()


def raw_nats(place, conn, n: int) -> None:
    import nats.js.api

    async def subscribe():
        await place.js.add_consumer(
            place.stream,
            nats.js.api.ConsumerConfig(durable_name="raw", max_ack_pending=1000),
        )
        return await place.js.pull_subscribe_bind("raw", place.stream)

    async def ack(msgs):
        for msg in msgs:
            await msg.ack()
        await place.nc.flush()

    sub = place._run(subscribe())
    done = 0
    while done < n:
        msgs = place._run(sub.fetch(batch=BATCH, timeout=1))
        insert(conn, [(m.headers["pgmsg-message-id"], m.data) for m in msgs])
        place._run(ack(msgs))
        done += len(msgs)


def raw_mqtt(place, conn, n: int) -> None:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    buffer: deque = deque()
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=f"{place.tag}-raw",
        protocol=mqtt.MQTTv5,
        manual_ack=True,
    )
    client.on_message = lambda c, u, m: buffer.append(m)
    client.connect("127.0.0.1", 1883, clean_start=False)
    client.loop_start()
    done = 0
    while done < n:
        taken = [buffer.popleft() for _ in range(min(BATCH, len(buffer)))]
        if not taken:
            time.sleep(0.001)
            continue
        insert(
            conn, [(dict(m.properties.UserProperty)["pgmsg-message-id"], m.payload) for m in taken]
        )
        for m in taken:
            client.ack(m.mid, m.qos)
        done += len(taken)
    client.disconnect()
    client.loop_stop()


def mqtt_session(place, client_id: str) -> None:
    """Make the persistent session a backlog is queued for (subscribed, then disconnected)."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 600
    client.connect("127.0.0.1", 1883, clean_start=True, properties=properties)
    client.loop_start()
    client.subscribe(place.topic, qos=1)[1]
    time.sleep(0.3)
    client.disconnect()
    client.loop_stop()


RAW = {"redis": raw_redis, "amqp": raw_amqp, "nats": raw_nats, "mqtt": raw_mqtt}


# -- the bridge ----------------------------------------------------------------------------


def inbox_count(conn: psycopg.Connection) -> int:
    return conn.execute(
        "SELECT count(*) FROM pgmsg_inbox_message WHERE inbox = %s", [INBOX]
    ).fetchone()[0]


def bridge_rate(url: str, place, n: int) -> float:
    from django.conf import settings
    from django.db import connections

    from pgmsg.core import conf
    from pgmsg.core.worker import Worker

    bridge = place.bridge(INBOX)
    if place.kind == "mqtt":
        bridge["url"] += f"&client_id={place.tag}-bridge"
    settings.PGMSG = {**settings.PGMSG, "INBOX_BRIDGES": {"bench": bridge}}
    conf.get.cache_clear()
    counter = psycopg.connect(url, autocommit=True)
    before = inbox_count(counter)
    start = time.perf_counter()
    worker = Worker(bridges=["bench"], batch_size=BATCH, install_signal_handlers=False)

    def run() -> None:
        profile = None
        if os.environ.get("BENCH_PROFILE"):  # a file name: the drain's cProfile statistics
            import cProfile

            profile = cProfile.Profile()
            profile.enable()
        try:
            worker.run()
        finally:
            connections.close_all()
            if profile is not None:
                profile.disable()
                profile.dump_stats(f"{os.environ['BENCH_PROFILE']}.{place.kind}")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while inbox_count(counter) - before < n:
        time.sleep(0.01)
    elapsed = time.perf_counter() - start
    counter.close()
    worker.stop()
    thread.join(30)
    return n / elapsed


# -- latency -------------------------------------------------------------------------------


def latencies(url: str, place, kind: str, m: int) -> list[tuple[float, float]]:
    from django.db import transaction

    import pgmsg
    from pgmsg_tests.testapp.outbox_declarations import BY_BROKER

    bridge = place.bridge(INBOX)
    if kind == "mqtt":
        bridge["url"] += f"&client_id={place.tag}-latency"
    env = dict(
        os.environ,
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE=SETTINGS,
        BENCH_BRIDGES=json.dumps({"bench": bridge}),
    )
    outbox = BY_BROKER[kind].name
    with psycopg.connect(url, autocommit=True) as conn:  # the drain's report is not this one's
        conn.execute("DELETE FROM pgmsg_inbox_bridge WHERE name = 'bench'")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "django", "listen", "-v", "0", *args],
            cwd=ROOT,
            env=env,
        )
        for args in (
            [f"--outbox={outbox}"],
            ["--bridge=bench"],
            [f"--inbox={INBOX}"],
        )
    ]
    found = []
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            while not conn.execute(
                "SELECT 1 FROM pgmsg_inbox_bridge WHERE name = 'bench' AND connected "
                "AND updated_at > now() - interval '5 seconds'"
            ).fetchone():
                time.sleep(0.05)
            for i in range(-WARM_UP, m):  # the first few are not counted: processes warm up
                message_id = f"latency-{place.tag}-{i}"
                with transaction.atomic():
                    pgmsg.publish(
                        outbox,
                        {"n": i},
                        type="tick",
                        topic=place.topic,
                        key=f"k{i % KEYS}",
                        message_id=message_id,
                    )
                committed = time.time()
                seen = None
                while True:
                    row = conn.execute(
                        "SELECT extract(epoch FROM processed_at)::float8, "
                        "extract(epoch FROM received_at)::float8, status "
                        "FROM pgmsg_inbox_message WHERE inbox = %s AND message_id = %s",
                        [INBOX, message_id],
                    ).fetchone()
                    if row and seen is None:
                        seen = time.time()
                    if row and row[2] == "processed":
                        if os.environ.get("BENCH_SLOW") and row[0] - committed > 0.1:
                            print(
                                f"slow #{i}: {row[0] - committed:.3f}s stored "
                                f"{row[1] - committed:.3f}s visible {seen - committed:.3f}s "
                                f"at {committed:.3f}"
                            )
                        if i >= 0:  # (A's commit -> handler, A's commit -> stored in B)
                            found.append((row[0] - committed, row[1] - committed))
                        break
                    time.sleep(0.001)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
    return found


def throughput(url: str, raw_conn: psycopg.Connection, kind: str, n: int) -> tuple[float, float]:
    """The raw loop's rate and the bridge's, each draining a backlog of ``n``."""
    from pgmsg_tests.inbox import bridge_brokers

    place = bridge_brokers.Place(kind)
    try:
        if kind == "mqtt":
            mqtt_session(place, f"{place.tag}-raw")
        prefill(place, n, f"raw-{place.tag}")
        start = time.perf_counter()
        RAW[kind](place, raw_conn, n)
        raw = n / (time.perf_counter() - start)
        if kind == "mqtt":
            mqtt_session(place, f"{place.tag}-bridge")
        elif kind == "redis":
            place.client.xtrim(place.topic, maxlen=0)
        prefill(place, n, f"bridge-{place.tag}")
        return raw, bridge_rate(url, place, n)
    finally:
        place.close()


def empty_the_inbox(conn: psycopg.Connection) -> None:
    """The latency part starts from an empty inbox: what the throughput part stored (tens of
    thousands of rows no handler took) is not the latency's to carry."""
    conn.execute("DELETE FROM pgmsg_inbox_message WHERE inbox = %s", [INBOX])
    conn.execute("DELETE FROM pgmsg_inbox_key WHERE inbox = %s", [INBOX])
    conn.execute("VACUUM ANALYZE pgmsg_inbox_message, pgmsg_inbox_key")


def inbox_alone(n: int, run: str) -> float:
    """receive_many() of prebuilt batches of BATCH, one transaction each, no broker: what any
    bridge's store costs, the ceiling of a bridge on this inbox."""
    from django.db import transaction

    import pgmsg

    batches = [
        [
            {
                "message_id": f"alone-{run}-{i}",
                "type": "tick",
                "payload": {"n": i},
                "aggregate_id": f"k{i % KEYS}",
                "source": "bench",
            }
            for i in range(first, min(first + BATCH, n))
        ]
        for first in range(0, n, BATCH)
    ]
    start = time.perf_counter()
    for batch in batches:
        with transaction.atomic():
            pgmsg.receive_many(INBOX, batch)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=5_000)
    parser.add_argument("--latency-n", type=int, default=200)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="throughput rounds per broker, raw then bridge in each; the medians are printed",
    )
    parser.add_argument("--brokers", default="redis,amqp,nats,mqtt")
    parser.add_argument(
        "--parts",
        default="throughput,latency,alone",
        help="what to measure, of throughput (raw and bridge), latency and alone (the inbox "
        "alone); all three by default",
    )
    args = parser.parse_args()

    url = common.scratch_url(SCRATCH_DB)
    with psycopg.connect(url) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
    print(
        f"pgmsg bridges benchmark  N={args.n}  batches of {BATCH}  latency over "
        f"{args.latency_n} messages  PostgreSQL {server}  {os.cpu_count()} cores  "
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
    )
    common.django_setup(url, settings=SETTINGS)
    from pgmsg_tests.inbox import bridge_brokers
    from pgmsg_tests.outbox import brokers

    raw_conn = psycopg.connect(url)
    raw_conn.execute("CREATE TABLE bench_raw (message_id text PRIMARY KEY, body jsonb)")
    raw_conn.commit()
    raw_conn.autocommit = True
    print(
        f"\n{'broker':<8} {'backlog':>8} {'raw msg/s':>10} {'bridge msg/s':>13} {'ratio':>6} "
        f"{'p50 ms':>7} {'p99 ms':>7}"
    )
    parts = set(args.parts.split(","))
    for kind in args.brokers.split(","):
        if not brokers.listening(brokers.PORTS[kind]):
            print(f"{kind:<8} skipped: {brokers.NAMES[kind]} is not listening")
            continue
        n = min(args.n, 900) if kind == "mqtt" else args.n
        raw = rate = p50 = p99 = float("nan")
        slowest = ""
        spread = ""
        if "throughput" in parts:
            rounds = [throughput(url, raw_conn, kind, n) for _ in range(args.rounds)]
            raw = statistics.median(r for r, _ in rounds)
            rate = statistics.median(b for _, b in rounds)
            if len(rounds) > 1:
                spread = "  rounds " + " ".join(f"{b / r:.2f}" for r, b in rounds)
        if "latency" in parts:
            empty_the_inbox(raw_conn)
            place = bridge_brokers.Place(kind)
            try:
                found = sorted(latencies(url, place, kind, args.latency_n))
            finally:
                place.close()
            totals = [total for total, _ in found]
            p50 = statistics.median(totals) * 1000
            p99 = totals[min(len(totals) - 1, int(len(totals) * 0.99))] * 1000
            total, stored = found[-1]
            slowest = f"  slowest {total * 1000:.1f} ms ({stored * 1000:.1f} ms until stored in B)"
        print(
            f"{kind:<8} {n:>8,} {raw:>10,.0f} {rate:>13,.0f} {rate / raw:>6.2f} "
            f"{p50:>7.1f} {p99:>7.1f}{spread}{slowest}"
        )
    if "alone" in parts:
        alone = [inbox_alone(args.n, f"{i}-{time.time()}") for i in range(args.rounds)]
        print(
            f"\ninbox alone (receive_many() of prebuilt batches of {BATCH}, no broker): "
            f"{statistics.median(alone):,.0f} msg/s (median of {len(alone)})"
        )
    raw_conn.close()


if __name__ == "__main__":
    main()
