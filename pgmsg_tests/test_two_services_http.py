"""The HTTP proof of issue 46: service A's outbox -> HTTP -> service B's webhook receiver (under
gunicorn) -> B's ordered inbox -> B's handler, each message's effect exactly once.

A is the test project on the test database (its outbox test.webhook, relayed by real
``manage.py listen`` processes); B is pgmsg_tests.service_b_settings on a database of its own
(a copy of the migrated test database), with its webhook receiver served by gunicorn behind a
TCP proxy and its inbox handled by real ``listen`` processes. While A publishes, A's relay, B's
gunicorn (a worker, or the whole server) and B's inbox worker are SIGKILLed at random, at least
20 times each, and the proxy is cut for 5 s. Then: every message's effect in B exactly once,
in key order, nothing pending on either side; bad input answered or dead-lettered, never lost.

PGMSG_PROOF_MESSAGES: the number of messages (default 10000, the issue's figure).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import time
from collections import Counter, defaultdict

import psycopg
import pytest
from django.db import connection, transaction

from pgmsg.core import signatures
from pgmsg.models import OutboxMessage
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.outbox.proxy import TcpProxy
from pgmsg_tests.served import Gunicorn
from pgmsg_tests.testapp.outbox_declarations import webhook

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

MESSAGES = int(os.environ.get("PGMSG_PROOF_MESSAGES", "10000"))
KEYS = 100
KILLS = int(os.environ.get("PGMSG_PROOF_KILLS", "20"))
SECRET = "outbox-test-secret"  # A's OUTBOX_HTTP_SECRETS["webhook"], B's WEBHOOKS secret
MAX_BODY = 4096


@pytest.fixture
def database_b():
    """B's database: a copy of the migrated test database (CREATE DATABASE ... TEMPLATE)."""
    name = f"{connection.settings_dict['NAME']}_b"[:63]
    admin_url = database_url(connection.settings_dict, name="postgres")
    connection.close()  # a template may have no other session
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{connection.settings_dict["NAME"]}"')
    yield database_url(connection.settings_dict, name=name)
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Chaos:
    """Restartable victims, each killed at random moments: ``kill(name)`` and restart."""

    def __init__(self, workers, server: Gunicorn, b_env: dict, proxy_url: str) -> None:
        self.workers, self.server, self.b_env = workers, server, b_env
        self.a_env = {
            "PGMSG_TEST_DESTINATIONS": json.dumps({"webhook": proxy_url}),
            # Through a cut proxy, a connection may hang rather than fail: bounded.
            "PGMSG_TEST_SETTINGS": json.dumps({"OUTBOX_PUBLISH_TIMEOUT": 2.0}),
        }
        self.kills: Counter = Counter()
        self.busy: Counter = Counter()
        self.procs = {"relay": self._relay(), "worker": self._worker()}

    def _relay(self):
        return self.workers.start(f"--outbox={webhook.name}", env=self.a_env)

    def _worker(self):
        return self.workers.start("--inbox=proof.http", env=self.b_env)

    def kill(self, name: str) -> None:
        pending = OutboxMessage.objects.filter(outbox=webhook.name, status="pending").exists()
        self.busy[name] += pending  # killed while A still had messages to deliver
        if name == "server":
            pids = self.server.worker_pids()
            if self.kills[name] % 4 == 3 or not pids:
                self.server.kill()  # master and workers: restarted by the test
                self.server.start()
            else:
                os.kill(random.choice(pids), signal.SIGKILL)  # the master starts another
        else:
            proc = self.procs[name]
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            self.procs[name] = self._relay() if name == "relay" else self._worker()
        self.kills[name] += 1


def post_to_b(server: Gunicorn, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    """POST to B's receiver directly, trying again while it restarts."""
    deadline = time.monotonic() + 60
    while True:
        connection_ = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            connection_.request("POST", "/pgmsg/webhooks/from_a/", body=body, headers=headers)
            answer = connection_.getresponse()
            return answer.status, json.loads(answer.read() or b"{}")
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        finally:
            connection_.close()


def test_a_to_b_over_http_every_effect_exactly_once_in_key_order(workers, database_b, tmp_path):
    b_env = {
        "DATABASE_URL": database_b,
        "DJANGO_SETTINGS_MODULE": "pgmsg_tests.service_b_settings",
        "PGMSG_PROOF_MAX_BODY": str(MAX_BODY),
    }
    server = Gunicorn("pgmsg_tests.wsgi", b_env, tmp_path / "gunicorn.log", workers=2)
    server.start()
    proxy = TcpProxy(server.port)
    try:
        chaos = Chaos(workers, server, b_env, proxy.url("http", path="/pgmsg/webhooks/from_a/"))
        started = time.monotonic()
        published = run_chaos(chaos, proxy)
        a_done = time.monotonic() - started
        redeliver(server, published)
        bad_input(server)
        check_b(database_b, published)
        # Shown with -s: the figures docs/bridges.md records.
        print(
            f"\nHTTP proof: {len(published)} messages, kills {dict(chaos.kills)} "
            f"(while A had messages pending: {dict(chaos.busy)}); "
            f"A's outbox empty after {a_done:.0f}s, B's effects checked after "
            f"{time.monotonic() - started:.0f}s"
        )
        for name, count in chaos.kills.items():
            assert count >= KILLS, (name, count)
    finally:
        proxy.close()
        server.kill()


def run_chaos(chaos: Chaos, proxy: TcpProxy) -> dict[str, tuple[str, int]]:
    """Publish MESSAGES over KEYS in chunks while killing; return message id -> (key, seq)."""
    published: dict[str, tuple[str, int]] = {}
    # Spread over about 30 s, so that most kills land while messages are on their way.
    size = max(100, -(-MESSAGES // 75))
    chunks = [range(start, min(start + size, MESSAGES)) for start in range(0, MESSAGES, size)]
    next_chunk = time.monotonic()
    due = {name: time.monotonic() + random.uniform(0.5, 2.5) for name in ("relay", "worker")}
    due["server"] = time.monotonic() + random.uniform(0.5, 2.5)
    cut_after = KILLS // 2
    halfway = len(chunks) // 2
    while chunks or min(chaos.kills[n] for n in due) < KILLS:
        if chunks and time.monotonic() >= next_chunk:
            next_chunk = time.monotonic() + 0.4
            with transaction.atomic():
                for n in chunks.pop(0):
                    key = f"key-{n % KEYS}"
                    message = webhook.publish("tick", {"seq": n // KEYS}, key=key)
                    published[message.message_id] = (key, n // KEYS)
                if len(chunks) == halfway:  # bad input through A, mid-stream
                    webhook.publish("nobody.handles", {"seq": 0}, key="odd-type")
                    webhook.publish("tick", {"seq": 0, "pad": "x" * MAX_BODY}, key="odd-size")
        if cut_after is not None and min(chaos.kills[n] for n in due) >= cut_after:
            cut_after = None
            proxy.cut()
            time.sleep(5)
            proxy.restore()
        now = time.monotonic()
        for name, when in due.items():
            if now >= when and chaos.kills[name] < KILLS:
                chaos.kill(name)
                due[name] = time.monotonic() + random.uniform(0.3, 2.0)
        time.sleep(0.1)
    wait_for(
        lambda: not OutboxMessage.objects.filter(outbox=webhook.name, status="pending").exists(),
        timeout=600,
        message="A's relay publishes everything",
    )
    (dead,) = OutboxMessage.objects.filter(outbox=webhook.name, status="dead")
    assert dead.key == "odd-size" and "HTTP 413" in dead.last_error  # refused, then dead
    return published


def redeliver(server: Gunicorn, published: dict[str, tuple[str, int]]) -> None:
    """A handled message sent again (an ack lost in a reconnect): 200, a duplicate; check_b
    then finds its effect once."""
    message_id = random.choice(list(published))
    key, seq = published[message_id]
    body = json.dumps({"seq": seq}).encode()
    headers = {
        **signatures.sign(SECRET, body),
        "pgmsg-message-id": message_id,
        "pgmsg-type": "tick",
        "pgmsg-key": key,
    }
    status, answer = post_to_b(server, body, headers)
    assert (status, answer.get("stored")) == (200, False)


def bad_input(server: Gunicorn) -> None:
    """Straight to B's receiver under gunicorn: each answered, nothing stored."""
    body = b"{not json"
    headers = {**signatures.sign(SECRET, body), "pgmsg-message-id": "x-1", "pgmsg-type": "tick"}
    status, answer = post_to_b(server, body, headers)
    assert status == 400 and "not JSON" in answer["error"]
    body = b'{"seq": 0}'
    status, answer = post_to_b(server, body, {**signatures.sign(SECRET, body), "pgmsg-type": "t"})
    assert status == 400 and "no message_id" in answer["error"]
    status, _ = post_to_b(server, body, {"pgmsg-message-id": "x-2", "pgmsg-type": "tick"})
    assert status == 401


def check_b(url: str, published: dict[str, tuple[str, int]]) -> None:
    def pending() -> int:
        with psycopg.connect(url) as b:
            query = "SELECT count(*) FROM pgmsg_inbox_message WHERE status = 'pending'"
            return b.execute(query).fetchone()[0]

    wait_for(lambda: pending() == 0, timeout=600, message="B's worker handles everything")
    with psycopg.connect(url) as b:
        effects = b.execute(
            "SELECT key, listener, (data->>'seq')::int FROM testapp_effect "
            "WHERE channel = 'proof.http' ORDER BY id"
        ).fetchall()
        dead = b.execute(
            "SELECT type, last_error FROM pgmsg_inbox_message WHERE status = 'dead'"
        ).fetchall()
        stored = b.execute("SELECT count(*) FROM pgmsg_inbox_message").fetchone()[0]
    counts = Counter(message_id for message_id, _, _ in effects)
    assert set(counts) == set(published), "every message's effect, and no other"
    assert max(counts.values()) == 1, "exactly once"
    per_key = defaultdict(list)
    for message_id, key, seq in effects:
        assert published[message_id] == (key, seq)
        per_key[key].append(seq)
    assert len(per_key) == KEYS
    assert all(seqs == sorted(seqs) for seqs in per_key.values()), "per-key order"
    assert [t for t, _ in dead] == ["nobody.handles"] and "no handler" in dead[0][1].lower()
    assert stored == len(published) + 1  # every id once, plus the unknown type
