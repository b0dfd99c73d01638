"""A killed worker never kills an innocent message (issue 44, item 2): a death is charged as a
crash only to a message that ran alone when its process died. The rows of a batch of several
that died are suspects without a charge, run alone afterwards; a message that kills its process
is dead after max_attempts deaths alone, and its batch-mates are handled (real processes,
SIGKILLed)."""

import os
import random
import signal
from collections import Counter

import psycopg
import pytest
from django.db import connection

import pgmsg
from pgmsg.models import InboxMessage
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.helpers import claims_on_record
from pgmsg_tests.inbox.test_inbox_poison import run_until_settled
from pgmsg_tests.inbox.test_inbox_processes import sessions_writing_effects
from pgmsg_tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]

#: The advisory lock the test holds while a worker's narrowing of its record must wait.
HOLD = 4444

# A worker that finds suspects in its batch records the whole batch, then narrows its record
# to the suspect it runs alone (claims.narrow: fewer ids, same transaction, still running).
# While the test holds HOLD, that UPDATE waits: a process killed there died with a batch of
# several rows on record, as a process killed by the OOM killer at that moment would.
HOLD_NARROWING = f"""
CREATE FUNCTION test_hold_narrowing() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.transaction_id = OLD.transaction_id
       AND cardinality(NEW.ids) < cardinality(OLD.ids)
       AND pg_xact_status(OLD.transaction_id::text::xid8) = 'in progress' THEN
        PERFORM pg_advisory_xact_lock_shared({HOLD});
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_hold_narrowing BEFORE UPDATE ON pgmsg_claim
    FOR EACH ROW EXECUTE FUNCTION test_hold_narrowing();
"""
RELEASE_NARROWING = """
DROP TRIGGER IF EXISTS test_hold_narrowing ON pgmsg_claim;
DROP FUNCTION IF EXISTS test_hold_narrowing();
"""


class HeldNarrowing:
    def __init__(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(HOLD_NARROWING)
        self.holder = psycopg.connect(database_url(connection.settings_dict), autocommit=True)
        self.holder.execute("SELECT pg_advisory_lock(%s)", [HOLD])

    def waiting(self) -> int | None:
        """The backend of a worker whose narrowing waits, if one does."""
        row = self.holder.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND NOT granted",
            [HOLD],
        ).fetchone()
        return row[0] if row else None

    def kill(self, proc, backend: int) -> None:
        """SIGKILL the worker process ``proc`` while its narrowing waits, and end that
        narrowing's session (a dead client's statement would otherwise go on once HOLD
        goes)."""
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self.holder.execute("SELECT pg_terminate_backend(%s)", [backend])
        wait_for(
            lambda: all(status != "in progress" for _, _, status in claims_on_record()),
            timeout=30,
            message="the killed batch's transaction has ended",
        )

    def release(self) -> None:
        self.holder.close()
        with connection.cursor() as cursor:
            cursor.execute(RELEASE_NARROWING)


@pytest.fixture
def held_narrowing():
    held = HeldNarrowing()
    yield held
    held.release()


def effects(inbox: str) -> Counter:
    return Counter(Effect.objects.filter(channel=f"inbox:{inbox}").values_list("key", flat=True))


@pytest.mark.parametrize(("inbox", "max_attempts"), [("test.inbox", 3), ("test.ordered", 2)])
def test_a_batch_killed_again_and_again_charges_only_the_message_that_died_alone(
    workers, held_narrowing, inbox, max_attempts
):
    ordered = inbox == "test.ordered"
    messages = [
        {
            "message_id": f"c{i}",
            "type": "step" if ordered else "work",
            "aggregate_id": f"agg-{i}",  # ordered: an aggregate each (one more holds none back)
            "payload": {"seq": 0, "die": i == 5},
        }
        for i in range(12)
    ]
    pgmsg.receive_many(inbox, messages)
    # The poison c5 kills the batch of all twelve.
    proc = workers.start("--inbox", inbox, "--batch-size", "50")
    wait_for(lambda: proc.poll() is not None, timeout=60, message="the poison kills its batch")
    # Then, max_attempts times, a worker records its batch of twelve suspects and dies before
    # it narrows the record to the one it would run alone: a batch of several, killed while
    # the innocents are in it.
    for _ in range(max_attempts):
        proc = workers.start("--inbox", inbox, "--batch-size", "50")
        backend = wait_for(held_narrowing.waiting, timeout=60, message="a worker narrowing")
        held_narrowing.kill(proc, backend)
    held_narrowing.release()
    # Each suspect runs alone now: the poison dies alone max_attempts times, then is dead.
    deaths = run_until_settled(workers, inbox)
    states = dict(InboxMessage.objects.filter(inbox=inbox).values_list("message_id", "status"))
    assert states == {f"c{i}": "dead" if i == 5 else "processed" for i in range(12)}
    assert deaths == max_attempts
    poison = InboxMessage.objects.get(inbox=inbox, message_id="c5")
    assert f"worker process died while handling it ({max_attempts} time(s))" in poison.last_error
    done = effects(inbox)
    expected = [f"agg-{i}:0" if ordered else f"c{i}" for i in range(12) if i != 5]
    assert sorted(done) == sorted(expected) and set(done.values()) == {1}


def test_workers_killed_again_and_again_mid_batch_kill_no_innocent_message(workers):
    # Handlers that never fail, over an unordered inbox (max_attempts 3) and an ordered one
    # (max_attempts 2); a worker is SIGKILLed mid-batch again and again, and another started.
    unordered = [
        {"message_id": f"u{i}", "type": "work", "payload": {"sleep_max": 0.01}} for i in range(400)
    ]
    steps = [
        {
            "message_id": f"o{a}-{seq}",
            "type": "step",
            "aggregate_id": f"agg-{a}",
            "payload": {"seq": seq, "sleep_max": 0.01},
        }
        for seq in range(40)
        for a in range(10)
    ]
    pgmsg.receive_many("test.inbox", unordered)
    pgmsg.receive_many("test.ordered", steps)
    args = ("--inbox", "test.inbox", "--inbox", "test.ordered", "--batch-size", "50")
    running = [workers.start(*args) for _ in range(2)]

    def pending() -> int:  # due ones: an ordered aggregate behind a dead letter waits
        return InboxMessage.objects.filter(status="pending").count() - behind_dead()

    def behind_dead() -> int:
        dead = InboxMessage.objects.filter(status="dead").values("aggregate_id")
        waiting = InboxMessage.objects.filter(status="pending", inbox="test.ordered")
        return waiting.filter(aggregate_id__in=dead).count()

    kills = 0
    while kills < 8 and pending():
        wait_for(
            lambda: sessions_writing_effects() > 0 or not pending(),
            timeout=60,
            message="a worker mid-batch",
        )
        live = [proc for proc in running if proc.poll() is None]
        if not pending() or not live:
            break
        victim = random.choice(live)
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        kills += 1
        running = [proc for proc in running if proc is not victim] + [workers.start(*args)]
    wait_for(lambda: not pending(), timeout=120, message="every message settled")
    assert kills >= 3  # (the workers were killed while they ran)
    dead = InboxMessage.objects.filter(status="dead")
    assert list(dead.values_list("message_id", "last_error")) == []
    assert behind_dead() == 0
    done = effects("test.inbox")
    assert sorted(done) == sorted(m["message_id"] for m in unordered)
    assert set(done.values()) == {1}
    done = effects("test.ordered")
    assert sorted(done) == sorted(f"agg-{a}:{seq}" for seq in range(40) for a in range(10))
    assert set(done.values()) == {1}
