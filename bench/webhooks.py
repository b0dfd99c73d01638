"""Benchmark: two services over HTTP, A's outbox -> B's webhook receiver (gunicorn) -> B's inbox.

- latency: one message per transaction in A, M of them (default 200), one at a time: the time
  from A's COMMIT returning until B's handler's effect row is visible in B's database (polled
  every 1 ms): commit -> A's relay POSTs -> B's receiver commits -> B's worker handles. p50, p99.
  Processes: A's relay (`listen --outbox`), B's gunicorn (4 sync workers) and B's inbox worker
  (`listen --inbox`).
- relay rate by concurrency: N messages (default 5,000) over 100 keys committed in A in one
  transaction; the rate is N over the time until A's relay has deleted the last row (every POST
  answered 200, so stored in B), with the destination's ``concurrency=1`` (one keep-alive
  connection, one POST after another) and ``concurrency=8`` (the default).
- receiver throughput: C client threads (default 8, the HTTP destination's default
  concurrency) POST N signed messages (default 5,000) to B's receiver, B's inbox worker
  stopped (receipt only); next to the raw ceiling: the same gunicorn, same client, a WSGI app
  (bench/webhooks_raw.py) that verifies nothing and INSERTs each body with plain psycopg. The
  ratio is receiver / raw.

    DATABASE_URL=postgres://... python bench/webhooks.py [--n 5000] [--latency-n 200]

Uses DATABASE_URL's server (or the embedded default) and scratch databases
`pgmsg_bench_webhooks_a` and `_b`, dropped and re-created. A runs pgmsg_tests.settings (its
outbox test.webhook), B pgmsg_tests.service_b_settings (its inbox proof.http).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402

SECRET = "outbox-test-secret"  # A's OUTBOX_HTTP_SECRETS["webhook"] and B's WEBHOOKS secret
PATH = "/pgmsg/webhooks/from_a/"
GUNICORN_WORKERS = 4
BODY = {"order_id": 12345, "total": "99.90", "note": "bench"}


def make_b(url_a: str) -> str:
    """B's database: a copy of A's, migrated already."""
    from django.db import connections

    from pgmsg_dev.devdb import database_url, parse_database_url

    connections.close_all()
    settings = parse_database_url(url_a)
    name_a = settings["NAME"]
    name_b = name_a[: -len("_a")] + "_b" if name_a.endswith("_a") else name_a + "_b"
    with psycopg.connect(database_url(settings, name="postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name_b}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name_b}" TEMPLATE "{name_a}"')
    url_b = database_url(settings, name=name_b)
    with psycopg.connect(url_b, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE bench_raw_webhook (id bigserial PRIMARY KEY, "
            "message_id text UNIQUE NOT NULL, payload jsonb NOT NULL, "
            "received_at timestamptz NOT NULL DEFAULT now())"
        )
    return url_b


def gunicorn(app: str, env: dict, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}"]
        + ["--workers", str(GUNICORN_WORKERS), "--preload", "--log-level", "warning", app],
        cwd=ROOT,
        env={**os.environ, **env},
        start_new_session=True,
    )
    import socket

    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"gunicorn {app} did not listen within 60 s")


def listen(env: dict, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "django", "listen", "-v", "0", *args],
        cwd=ROOT,
        env={**os.environ, **env},
    )


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=60)


def post_load(port: int, n: int, clients: int) -> float:
    """``clients`` threads POST n signed messages in all; messages per second."""
    from pgmsg.core import signatures

    bodies = [json.dumps({**BODY, "i": i}).encode() for i in range(n)]
    failures: list[str] = []

    def client(share: range) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for i in share:
            headers = {
                **signatures.sign(SECRET, bodies[i]),
                "pgmsg-message-id": str(uuid.uuid4()),
                "pgmsg-type": "tick",
                "pgmsg-key": f"k{i % 100}",
                "content-type": "application/json",
            }
            connection.request("POST", PATH, body=bodies[i], headers=headers)
            answer = connection.getresponse()
            answer.read()
            if answer.status != 200:
                failures.append(f"{answer.status}")
            if answer.will_close:
                connection.close()  # http.client opens a new one on the next request
        connection.close()

    threads = [
        threading.Thread(target=client, args=(range(c, n, clients),)) for c in range(clients)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise SystemExit(f"{len(failures)} POSTs failed: {failures[:5]}")
    return n / elapsed


def latencies(url_b: str, count: int) -> list[float]:
    from django.db import transaction

    from pgmsg_tests.testapp.outbox_declarations import webhook

    found = []
    with psycopg.connect(url_b, autocommit=True) as b:

        def handled(message_id: str) -> bool:
            return bool(
                b.execute(
                    "SELECT 1 FROM testapp_effect WHERE channel = 'proof.http' AND key = %s",
                    [message_id],
                ).fetchone()
            )

        for i in range(count + 5):  # the first 5 warm up (connections, partitions)
            with transaction.atomic():
                message = webhook.publish("tick", {"seq": i}, key=f"k{i % 100}")
            started = time.perf_counter()
            deadline = time.time() + 60
            while not handled(message.message_id):
                if time.time() > deadline:
                    raise SystemExit("B did not handle a message within 60 s")
                time.sleep(0.001)
            if i >= 5:
                found.append(time.perf_counter() - started)
    return found


def relay_rate(a_env: dict, port: int, b_env: dict, n: int, concurrency: int) -> float:
    from django.db import connection, transaction

    from pgmsg_tests.testapp.outbox_declarations import webhook

    url = f"http://127.0.0.1:{port}{PATH}?concurrency={concurrency}"
    env = {**a_env, "PGMSG_TEST_DESTINATIONS": json.dumps({"webhook": url})}
    server = gunicorn("pgmsg_tests.wsgi", b_env, port)
    relay = listen(env, "--outbox=test.webhook")

    def pending() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pgmsg_outbox_message WHERE outbox = 'test.webhook'"
            )
            return cursor.fetchone()[0]

    try:
        with transaction.atomic():
            webhook.publish("tick", {"warm": True}, key="warm")
        deadline = time.time() + 60
        while pending():
            if time.time() > deadline:
                raise SystemExit("the relay did not publish within 60 s")
            time.sleep(0.05)
        with transaction.atomic():  # one commit
            for i in range(n):
                webhook.publish("tick", {**BODY, "seq": i}, key=f"k{i % 100}")
        started = time.perf_counter()
        while pending():
            time.sleep(0.005)
        return n / (time.perf_counter() - started)
    finally:
        stop(relay)
        stop(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=5_000)
    parser.add_argument("--latency-n", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()

    url_a = common.scratch_url("pgmsg_bench_webhooks_a")
    common.django_setup(url_a)  # pgmsg_tests.settings, migrated
    url_b = make_b(url_a)
    port = _free_port()
    b_env = {
        "DATABASE_URL": url_b,
        "DJANGO_SETTINGS_MODULE": "pgmsg_tests.service_b_settings",
        "RAW_DATABASE_URL": url_b,
    }
    a_env = {
        "DATABASE_URL": url_a,
        "DJANGO_SETTINGS_MODULE": "pgmsg_tests.settings",
        "PGMSG_TEST_DESTINATIONS": json.dumps({"webhook": f"http://127.0.0.1:{port}{PATH}"}),
    }
    print(
        f"webhooks: {GUNICORN_WORKERS} gunicorn sync workers, {args.clients} client threads, "
        f"n={args.n}, latency n={args.latency_n}"
    )

    for concurrency in (1, 8):
        rate = relay_rate(a_env, port, b_env, args.n, concurrency)
        print(f"A's relay -> B's receiver, concurrency={concurrency}: {rate:,.0f} msg/s")

    raws, receivers = [], []
    for _ in range(2):  # raw, receiver, raw, receiver: the machine's drift shows
        server = gunicorn("bench.webhooks_raw", b_env, port)
        try:
            raws.append(post_load(port, args.n, args.clients))
        finally:
            stop(server)
        server = gunicorn("pgmsg_tests.wsgi", b_env, port)
        try:
            receivers.append(post_load(port, args.n, args.clients))
        finally:
            stop(server)
    raw, receiver = statistics.mean(raws), statistics.mean(receivers)
    print(f"{'':<28} {'min median max msg/s':>30}")
    print(f"{'raw WSGI + psycopg INSERT':<28} {common.spread(raws):>30}")
    print(f"{'pgmsg webhook receiver':<28} {common.spread(receivers):>30}")
    print(f"receiver / raw (means): {receiver / raw:.2f} (target >= 0.5)")

    with psycopg.connect(url_b, autocommit=True) as b:  # the load's messages: not for B's worker
        b.execute("TRUNCATE pgmsg_inbox_message, pgmsg_inbox_key")
    server = gunicorn("pgmsg_tests.wsgi", b_env, port)
    worker = listen(b_env, "--inbox=proof.http")
    relay = listen(a_env, "--outbox=test.webhook")
    try:
        found = latencies(url_b, args.latency_n)
    finally:
        for proc in (relay, worker, server):
            stop(proc)
    found.sort()
    p50 = found[len(found) // 2] * 1000
    p99 = found[min(len(found) - 1, int(len(found) * 0.99))] * 1000
    print(f"A commit -> B handler: p50 {p50:.1f} ms, p99 {p99:.1f} ms ({len(found)} messages)")


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


if __name__ == "__main__":
    main()
