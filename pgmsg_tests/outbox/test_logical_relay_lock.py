"""The relay lock of a logical outbox, which drop-slot takes to refuse while a relay runs.

A relay holds it as long as its connection lives, so nothing that is not an outage may make
the relay reconnect: the slot busy with another session (health's look at the oldest
unrelayed message) when the relay confirms what it published did, and for that moment
drop-slot could drop the slot of a running relay. health() reports it for this database only.
"""

from __future__ import annotations

import contextlib

import psycopg
import pytest
from django.db import connections

import pgmsg
from pgmsg.core import locks
from pgmsg.core.worker import Worker
from pgmsg.outbox import logical_source as logical
from pgmsg.outbox import operations, slots
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.outbox.test_logical import (
    DB,
    ahead_of_slot,
    logical_outboxes_ready,  # noqa: F401 (the fixture)
    slot_state,
)
from pgmsg_tests.testapp import outbox_declarations
from pgmsg_tests.testapp.logical_outboxes import RECORDED

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "logical"]),
    pytest.mark.usefixtures("logical_outboxes_ready"),
]


@contextlib.contextmanager
def slot_kept_busy(outbox: str):
    """A replication connection streaming ``outbox``'s slot that reads and confirms nothing:
    the slot is active, so the relay's peeks and advances find it in use, until it closes."""
    url = database_url(connections[DB].settings_dict)
    conninfo = psycopg.conninfo.make_conninfo(url, replication="database")
    walsender = psycopg.pq.PGconn.connect(conninfo.encode())
    assert walsender.status == psycopg.pq.ConnStatus.OK, walsender.get_error_message()
    walsender.send_query(
        f"START_REPLICATION SLOT {slots.slot_name(outbox, using=DB)} LOGICAL 0/0 "
        f"(proto_version '1', publication_names '{logical.PUBLICATION}', messages 'true')".encode()
    )
    try:
        wait_for(lambda: slot_state(outbox)[0], message="the replication connection holds it")
        yield
    finally:
        walsender.finish()
    wait_for(lambda: not slot_state(outbox)[0], message="the slot is free again")


def test_a_busy_slot_when_the_relay_confirms_keeps_its_lock_and_sends_nothing_twice(
    monkeypatch,
):
    first = pgmsg.publish(RECORDED, {"n": 1}, type="t").message_id
    second = pgmsg.publish(RECORDED, {"n": 2}, type="t").message_id
    worker = Worker(outboxes=[RECORDED], install_signal_handlers=False, until_idle=True)
    (relay,) = worker.sources
    settle = relay._settle_in_order
    busy = contextlib.ExitStack()

    def settle_then_busy(*args):
        settled = settle(*args)
        busy.enter_context(slot_kept_busy(RECORDED))  # between the publish and the advance
        return settled

    monkeypatch.setattr(relay, "_settle_in_order", settle_then_busy)
    with busy:
        assert relay.process_batch(worker) == 0  # published, not confirmed: no spin on it
        assert [e.message_id for e in outbox_declarations.RECORDED] == [first, second]
        assert relay.held == [0] and relay._held_on is connections[DB].connection
        assert operations.health([RECORDED])[0].relayed_partitions == (0,)
        # drop-slot's lock, from a session of its own (this one is the relay's: it may).
        with psycopg.connect(database_url(connections[DB].settings_dict)) as other:
            lock = other.execute(
                slots.QUERIES["lock_outbox"], {"outbox": RECORDED, "lock_space": locks.OUTBOX}
            )
            assert lock.fetchone() == (False,)
        monkeypatch.undo()

    relay.process_batch(worker)  # confirms first, then finds nothing new
    assert [e.message_id for e in outbox_declarations.RECORDED] == [first, second]
    assert ahead_of_slot(RECORDED) == []


def test_health_counts_only_relay_locks_taken_in_its_own_database():
    """A relay of an outbox with the same name in another database of the server (a second
    test run, a staging copy) holds nothing that drop-slot checks here."""
    other = database_url(connections[DB].settings_dict, name="postgres")
    with psycopg.connect(other, autocommit=True) as elsewhere:
        taken = elsewhere.execute(
            "SELECT pg_try_advisory_lock(hashtext(%s || %s), 0)", [locks.OUTBOX, RECORDED]
        ).fetchone()[0]
        assert taken
        assert operations.health([RECORDED])[0].relayed_partitions == ()
