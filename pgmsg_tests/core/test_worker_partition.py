"""A worker behind a silent network partition (no FIN, no RST) notices it on its own side
within CONNECTION_DEAD_AFTER, says so, and reconnects once the path returns (core/keepalive.py).

The workers reach PostgreSQL through blackhole.BlackholeProxy: packets between them and the
proxy are dropped, so nothing but the workers' own keepalives and timeouts can tell them. The
server's side of their sessions is the proxy, which stays up: its keepalives never give up, so
the server cannot end the workers' sessions for them either (but for a batch transaction left
idle: WORKER_IDLE_TIMEOUT). Without the client's settings a worker waited there for the kernel
to stop retransmitting its sweep (about 15 minutes): these tests' 60 s waits ran out.
"""

import json
import socket

import pytest
from django.db import connection, connections

import pgmsg
from pgmsg.core import keepalive, wake
from pgmsg.models import Notification
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import skip_unless, wait_for
from pgmsg_tests.core import blackhole
from pgmsg_tests.helpers import effect_counts, locked_rows
from pgmsg_tests.testapp.channels import Work

LOST = "connection to PostgreSQL lost: no answer for 2 s (network partition?); reconnecting"


@pytest.fixture
def proxy():
    why = blackhole.available()
    skip_unless(not why, f"the blackhole proxy {why}")
    settings = connection.settings_dict
    host, port = settings["HOST"] or "/tmp", settings["PORT"] or "5432"
    target = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, int(port))
    made = blackhole.BlackholeProxy(target)
    yield made
    made.close()


def start_behind(workers, proxy, *args: str):
    url = database_url({**connection.settings_dict, "HOST": "127.0.0.1", "PORT": proxy.port})
    return workers.start(
        *args,
        prefix=proxy.prefix,
        env={
            "DATABASE_URL": url,
            "PGMSG_TEST_SETTINGS": json.dumps({"CONNECTION_DEAD_AFTER": 2.0}),
        },
    )


def idle_declared() -> bool:
    """Some session holds a wake-up idle key (core/wake.py): a worker went to sleep."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s::oid",
            [wake.IDLE_CLASS],
        )
        return cursor.fetchone()[0] > 0


pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def test_an_idle_worker_notices_a_silent_partition_and_reconnects_after_it(workers, proxy):
    proc = start_behind(workers, proxy, "test.work")
    pgmsg.notify(Work(key="before"))
    wait_for(lambda: effect_counts()["before"] == 1, timeout=60, message="connected")
    wait_for(idle_declared, timeout=60, message="the worker sleeps in LISTEN")
    proxy.blackhole()
    try:
        wait_for(
            lambda: LOST in workers.log(proc),
            timeout=60,
            message="the worker notices the partition",
        )
    finally:
        proxy.restore()
    pgmsg.notify(Work(key="after"))  # to the database itself, not through the proxy
    wait_for(lambda: effect_counts()["after"] == 1, timeout=60, message="the worker is back")
    assert proc.poll() is None
    assert workers.log(proc).count("network partition?") == 1, workers.log(proc)


def test_a_partition_during_a_batch_costs_the_batch_only_its_transaction(workers, proxy):
    proc = start_behind(workers, proxy, "test.work", "--batch-size", "50")
    keys = [f"p{i}" for i in range(40)]
    pgmsg.notify_many(Work(key=k, sleep=0.05) for k in keys)
    wait_for(lambda: locked_rows() > 0, timeout=60, message="the worker holds a batch")
    proxy.blackhole()
    try:
        wait_for(
            lambda: LOST in workers.log(proc),
            timeout=60,
            message="the worker notices the partition mid-batch",
        )
    finally:
        proxy.restore()
    wait_for(lambda: not Notification.objects.exists(), timeout=60, message="the batch is handled")
    # The batch's writes went with its transaction (PostgreSQL ended the session idle in it,
    # WORKER_IDLE_TIMEOUT): handled again in full after the reconnect, each message once.
    assert sorted(effect_counts()) == sorted(keys)
    assert set(effect_counts().values()) == {1}
    assert proc.poll() is None


def test_a_connection_the_network_forgot_holds_the_worker_no_longer_than_the_setting(
    workers, proxy
):
    # A firewall or NAT that lost the connections' state: their packets are dropped for good
    # (no FIN, no RST), new connections pass. The worker that waited for its sweep's answer
    # there is back on a new connection within CONNECTION_DEAD_AFTER and a reconnect.
    proc = start_behind(workers, proxy, "test.work")
    pgmsg.notify(Work(key="before"))
    wait_for(lambda: effect_counts()["before"] == 1, timeout=60, message="connected")
    wait_for(idle_declared, timeout=60, message="the worker sleeps in LISTEN")
    proxy.forget()
    pgmsg.notify(Work(key="after"))
    wait_for(lambda: effect_counts()["after"] == 1, timeout=60, message="the worker is back")
    assert LOST in workers.log(proc)


def test_the_worker_gives_its_connections_the_client_settings_under_the_users(settings):
    settings.PGMSG = {**settings.PGMSG, "CONNECTION_DEAD_AFTER": 12.0}
    db = connections["default"]
    original = db.settings_dict["OPTIONS"]
    mine = {**original, "keepalives_idle": 7}
    db.settings_dict["OPTIONS"] = mine
    try:
        db.ensure_connection()
        session = db.connection
        with keepalive.on(db):
            assert db.settings_dict["OPTIONS"] == {
                **mine,
                "keepalives": 1,
                "keepalives_interval": 2,
                "keepalives_count": 3,
                "tcp_user_timeout": 12000,
                "connect_timeout": 12,
            }
            assert db.connection is session  # kept: its socket got them (below, over TCP)
            db.close()
            db.ensure_connection()  # a new connection: libpq sets them
            given = db.connection.info.get_parameters()
            assert (given["keepalives_idle"], given["tcp_user_timeout"]) == ("7", "12000")
        assert db.settings_dict["OPTIONS"] is mine
    finally:
        db.settings_dict["OPTIONS"] = original
        db.close()


def test_an_open_connections_socket_gets_the_settings_from_the_kernel():
    options = {"keepalives_idle": 7, "keepalives_interval": 2, "keepalives_count": 3}
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname()) as client:
            keepalive.on_socket(client.fileno(), {**options, "tcp_user_timeout": 12000})
            tcp = socket.IPPROTO_TCP
            assert client.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert client.getsockopt(tcp, socket.TCP_KEEPIDLE) == 7
            assert client.getsockopt(tcp, socket.TCP_KEEPINTVL) == 2
            assert client.getsockopt(tcp, socket.TCP_KEEPCNT) == 3
            assert client.getsockopt(tcp, socket.TCP_USER_TIMEOUT) == 12000
