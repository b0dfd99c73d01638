"""Benchmark: the outbox relay per broker, next to the same client library publishing directly.

For each broker that listens on 127.0.0.1 (RabbitMQ, NATS JetStream, Redis, Mosquitto):

- direct: the client library pgmsg uses publishes N messages (default 10,000) with the same
  confirmation the relay waits for (pika: publisher confirms, one at a time, as pika's blocking
  channel does; nats-py: JetStream acks, 100 awaited together; redis-py: XADD pipelined 100 at
  a time; paho-mqtt: QoS 1, 100 PUBACKs awaited together), and the relay's headers. Groups of
  100 are what the relay publishes too: a wave holds one message per key, and there are 100.
  Measured before and after the relay; the mean is printed.
- relay: one `manage.py listen --outbox --batch-size 500` process, already running and idle;
  N messages over 100 keys are committed in one transaction (each batch: 5 waves of 100); the
  rate is N over the time from the commit until the relay has deleted the last row (every
  message confirmed by the broker).
- latency: one message per transaction, one at a time, M of them (default 300): the time from
  the producer's COMMIT returning until the relay's delete of the row is visible (polled every
  1 ms), i.e. commit -> broker confirmed -> relay acknowledged, an upper bound of commit to
  broker; p50 and p99.

    DATABASE_URL=postgres://... python bench/outbox.py [--n 10000] [--latency-n 300]
                                                       [--capture table|logical]

With ``--capture logical`` the outboxes capture with logical decoding (the server needs
wal_level = logical): the N messages are published in one transaction as well, the rate runs
until the slot's confirmed position passes their end, and a latency sample ends when it passes
the end of its message (pg_current_wal_insert_lsn() read in the producer's transaction).

Uses DATABASE_URL's server (or the embedded default) and a scratch database
`pgmsg_bench_outbox` that it drops and re-creates; on the brokers it uses the queue
`pgmsg-bench`, the stream PGMSGBENCH, the key `pgmsg-bench` and the topic `pgmsg-bench/...`,
and removes them at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402

SCRATCH_DB = "pgmsg_bench_outbox"
SETTINGS = "bench.settings"
GROUP = 100
KEYS = 100
BODY = b'{"order_id": 12345, "total": "99.90", "note": "bench"}'


def headers(message_id: str, n: int) -> dict[str, str]:
    """The headers the relay sends (so both sides publish the same messages)."""
    return {
        "pgmsg-message-id": message_id,
        "pgmsg-type": "bench",
        "pgmsg-outbox": "bench",
        "pgmsg-key": f"k{n % KEYS}",
        "pgmsg-redelivery-count": "0",
    }


# -- the client libraries publishing directly ---------------------------------------------------


def direct_amqp(n: int) -> float:
    import pika

    connection = pika.BlockingConnection(
        pika.URLParameters("amqp://guest:guest@127.0.0.1:5672/%2F")
    )
    channel = connection.channel()
    channel.queue_declare("pgmsg-bench")
    channel.confirm_delivery()
    t = time.perf_counter()
    for i in range(n):
        message_id = str(uuid.uuid4())
        channel.basic_publish(
            "",
            "pgmsg-bench",
            BODY,
            pika.BasicProperties(
                message_id=message_id,
                type="bench",
                delivery_mode=pika.DeliveryMode.Persistent,
                content_type="application/json",
                headers=headers(message_id, i),
            ),
            mandatory=True,
        )
    elapsed = time.perf_counter() - t
    channel.queue_purge("pgmsg-bench")
    connection.close()
    return n / elapsed


def direct_nats(n: int) -> float:
    import nats

    async def run() -> float:
        client = await nats.connect("nats://127.0.0.1:4222")
        js = client.jetstream()
        t = time.perf_counter()
        for start in range(0, n, GROUP):
            await asyncio.gather(
                *(
                    js.publish(
                        "pgmsgbench.direct",
                        BODY,
                        headers={**headers(mid, i), "Nats-Msg-Id": mid},
                    )
                    for i, mid in ((i, str(uuid.uuid4())) for i in range(min(GROUP, n - start)))
                )
            )
        elapsed = time.perf_counter() - t
        await client.close()
        return n / elapsed

    return asyncio.run(run())


def direct_redis(n: int) -> float:
    import redis

    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    t = time.perf_counter()
    for start in range(0, n, GROUP):
        pipe = client.pipeline(transaction=False)
        for i in range(min(GROUP, n - start)):
            message_id = str(uuid.uuid4())
            pipe.xadd(
                "pgmsg-bench",
                {
                    "message_id": message_id,
                    "type": "bench",
                    "key": f"k{i % KEYS}",
                    "payload": BODY,
                    "headers": json.dumps(headers(message_id, i)),
                },
            )
        pipe.execute()
    elapsed = time.perf_counter() - t
    client.delete("pgmsg-bench")
    client.close()
    return n / elapsed


def direct_mqtt(n: int) -> float:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.max_inflight_messages_set(1000)
    client.connect("127.0.0.1", 1883)
    client.loop_start()
    time.sleep(0.2)
    t = time.perf_counter()
    for start in range(0, n, GROUP):
        infos = []
        for i in range(min(GROUP, n - start)):
            properties = Properties(PacketTypes.PUBLISH)
            properties.ContentType = "application/json"
            properties.UserProperty = list(headers(str(uuid.uuid4()), i).items())
            infos.append(client.publish("pgmsg-bench/direct", BODY, qos=1, properties=properties))
        for info in infos:
            info.wait_for_publish(10)
    elapsed = time.perf_counter() - t
    client.disconnect()
    client.loop_stop()
    return n / elapsed


DIRECT = {"amqp": direct_amqp, "nats": direct_nats, "redis": direct_redis, "mqtt": direct_mqtt}
OUTBOXES = {"amqp": "test.rabbit", "nats": "test.nats", "redis": "test.redis", "mqtt": "test.mqtt"}
TOPICS = {
    "amqp": "pgmsg-bench",
    "nats": "pgmsgbench.relay",
    "redis": "pgmsg-bench",
    "mqtt": "pgmsg-bench/relay",
}


def prepare_nats() -> None:
    import nats

    async def run() -> None:
        client = await nats.connect("nats://127.0.0.1:4222")
        js = client.jetstream()
        try:
            await js.delete_stream("PGMSGBENCH")
        except Exception:  # not there yet
            pass
        await js.add_stream(name="PGMSGBENCH", subjects=["pgmsgbench.>"])
        await client.close()

    asyncio.run(run())


def cleanup_nats() -> None:
    import nats

    async def run() -> None:
        client = await nats.connect("nats://127.0.0.1:4222")
        await client.jetstream().delete_stream("PGMSGBENCH")
        await client.close()

    asyncio.run(run())


def cleanup_amqp() -> None:
    import pika

    connection = pika.BlockingConnection(
        pika.URLParameters("amqp://guest:guest@127.0.0.1:5672/%2F")
    )
    connection.channel().queue_delete("pgmsg-bench")
    connection.close()


# -- the relay -------------------------------------------------------------------------------


def pending(conn: psycopg.Connection, outbox: str) -> int:
    return conn.execute(
        "SELECT count(*) FROM pgmsg_outbox_message WHERE outbox = %s", [outbox]
    ).fetchone()[0]


def relay_rate_and_latency(
    url: str, kind: str, n: int, latency_n: int, batch_size: int, capture: str
) -> tuple[float, list]:
    from django.db import connection, transaction

    import pgmsg
    from pgmsg.outbox import declarations, slots
    from pgmsg.outbox import logical_source as logical
    from pgmsg_tests.testapp import logical_outboxes

    logical_mode = capture == "logical"
    if logical_mode:
        outbox = logical_outboxes.declare_per_broker()[kind].name
        # The slot exists before the first publish (the relay would make it at its start).
        logical.LogicalRelay(declarations.registry.get(outbox)).prepare("default")
        slot = slots.slot_name(outbox, using="default")
    else:
        outbox = OUTBOXES[kind]
    env = dict(os.environ, DATABASE_URL=url, DJANGO_SETTINGS_MODULE=SETTINGS)
    env["PGMSG_TEST_LOGICAL"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "listen", "--outbox", outbox, "-v", "0"]
        + ["--batch-size", str(batch_size)],
        cwd=ROOT,
        env=env,
    )

    def wal_position() -> str:  # inside the producer's transaction, after its messages
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_wal_insert_lsn()::text")
            return cursor.fetchone()[0]

    try:
        with psycopg.connect(url, autocommit=True) as conn:

            def relayed(row_id=None, lsn=None) -> bool:
                """Table: the row (or every row) is deleted. Logical: the slot's confirmed
                position passed the end of the producer's messages."""
                if logical_mode:
                    return conn.execute(
                        "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots "
                        "WHERE slot_name = %s",
                        [lsn, slot],
                    ).fetchone()[0]
                if row_id is None:
                    return not pending(conn, outbox)
                return not conn.execute(
                    "SELECT 1 FROM pgmsg_outbox_message WHERE id = %s", [row_id]
                ).fetchone()

            # Warm up: the relay is connected to the broker and holds its partition.
            with transaction.atomic():
                pgmsg.publish(outbox, {"warm": True}, type="bench", topic=TOPICS[kind])
                lsn = wal_position()
            deadline = time.time() + 60
            while not relayed(lsn=lsn):
                if time.time() > deadline or proc.poll() is not None:
                    raise SystemExit(f"{kind}: the relay did not publish within 60 s")
                time.sleep(0.05)
            bodies = [{"order_id": i, "total": "99.90", "note": "bench"} for i in range(n)]
            with transaction.atomic():  # one commit, one NOTIFY
                if logical_mode:
                    for i, body in enumerate(bodies):
                        pgmsg.publish(
                            outbox, body, type="bench", topic=TOPICS[kind], key=f"k{i % KEYS}"
                        )
                    lsn = wal_position()
                else:
                    _publish_untyped_many(outbox, kind, bodies)
            t = time.perf_counter()
            while not relayed(lsn=lsn):
                time.sleep(0.005)
            rate = n / (time.perf_counter() - t)
            latencies = []
            for i in range(latency_n):
                with transaction.atomic():
                    row = pgmsg.publish(
                        outbox, {"i": i}, type="bench", topic=TOPICS[kind], key=f"k{i % KEYS}"
                    )
                    lsn = wal_position() if logical_mode else None
                t = time.perf_counter()
                while not relayed(row.id, lsn):
                    time.sleep(0.001)
                latencies.append(time.perf_counter() - t)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        if logical_mode:
            slots.drop(outbox, using="default")
    return rate, latencies


def _publish_untyped_many(outbox: str, kind: str, bodies: list[dict]) -> None:
    """N rows in one statement (publish_many takes typed messages; this is its SQL)."""
    from django.db import connection

    from pgmsg.core import locks
    from pgmsg.outbox import declarations

    spec = declarations.registry.get(outbox)
    with connection.cursor() as cursor:
        cursor.execute(
            declarations.QUERIES["publish_many"],
            {
                "outbox": outbox,
                "lock_space": locks.OUTBOX,
                "destination": spec.destination,
                "message_ids": [str(uuid.uuid4()) for _ in bodies],
                "topics": [TOPICS[kind]] * len(bodies),
                "types": ["bench"] * len(bodies),
                "keys": [f"k{i % KEYS}" for i in range(len(bodies))],
                "payloads": [json.dumps(b) for b in bodies],
                "headers": ["{}"] * len(bodies),
            },
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--latency-n", type=int, default=300)
    parser.add_argument("--brokers", default="amqp,nats,redis,mqtt")
    parser.add_argument("--batch-size", type=int, default=500, help="the relay's --batch-size")
    parser.add_argument(
        "--capture", choices=["table", "logical"], default="table", help="the outboxes' mode"
    )
    args = parser.parse_args()

    from pgmsg_tests.outbox import brokers

    url = common.scratch_url(SCRATCH_DB)
    with psycopg.connect(url) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
    print(
        f"pgmsg outbox benchmark  capture={args.capture}  N={args.n}  "
        f"relay --batch-size {args.batch_size}  "
        f"latency over {args.latency_n} messages  "
        f"PostgreSQL {server}  {os.cpu_count()} cores  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
    )
    common.django_setup(url, settings=SETTINGS)
    print(
        f"\n{'broker':<10} {'direct msg/s':>13} {'relay msg/s':>12} {'ratio':>6} "
        f"{'p50 ms':>7} {'p99 ms':>7}"
    )
    for kind in args.brokers.split(","):
        if not brokers.listening(brokers.PORTS[kind]):
            print(f"{kind:<10} skipped: {brokers.NAMES[kind]} is not listening")
            continue
        if kind == "nats":
            prepare_nats()
        direct = DIRECT[kind](args.n)
        rate, latencies = relay_rate_and_latency(
            url, kind, args.n, args.latency_n, args.batch_size, args.capture
        )
        latencies.sort()
        p50 = statistics.median(latencies) * 1000
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
        print(
            f"{kind:<10} {direct:>13,.0f} {rate:>12,.0f} {rate / direct:>6.0%} "
            f"{p50:>7.2f} {p99:>7.2f}"
        )
        if kind == "nats":
            cleanup_nats()
        if kind == "amqp":
            cleanup_amqp()
        if kind == "redis":
            import redis

            redis.Redis.from_url("redis://127.0.0.1:6379/0").delete("pgmsg-bench")


if __name__ == "__main__":
    main()
