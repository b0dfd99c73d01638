"""The claim record of a subscription's batch (pgmsg/core/claims.py) while its handlers run.

Before the handlers run, the worker sends the batch's claim record on its side connection.
When the read found no claim of events whose batch died, the handlers run while the record
commits and its answer is read by the batch's end; with one on record, they wait for the
answer (which names the suspects). Either way the record is there for the batch, and a
handler that fails while the record is on its way leaves the side connection usable and no
crash behind. The record of a batch whose worker dies is tested with real processes
(test_subscriptions_processes.py)."""

import pytest
from django.db import connection

import pgmsg
from pgmsg.core import claims
from pgmsg.core.worker import Worker
from pgmsg.models import SubscriptionPartition
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.helpers import claims_on_record, ended_transaction_id, record_claim
from pgmsg_tests.testapp.events_handlers import Step

pytestmark = pytest.mark.django_db(transaction=True)

RECORDED = pgmsg.Subscription("test-records", category="records", partitions=1, max_attempts=5)
#: What each call of the handler saw: (step, whether its batch's record was still on its way).
seen: list[tuple[int, bool]] = []
running: dict[str, Worker] = {}
failing = {"on": True}


@RECORDED.handler(Step)
def note(recorded) -> None:
    seen.append((recorded.event.n, running["worker"].record_in_flight is not None))
    if recorded.event.fail and failing["on"]:
        raise RuntimeError("fails until fixed")


@pytest.fixture(autouse=True)
def clean():
    seen.clear()
    failing["on"] = True
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM pgmsg_claim")
    yield
    running.clear()


def drain_until(predicate, message: str) -> Worker:
    def drained():
        worker = running["worker"] = Worker(
            subscriptions=[RECORDED.name], until_idle=True, install_signal_handlers=False
        )
        worker.run()
        assert worker.record_in_flight is None  # every answer was read by the batch's end
        return predicate() and worker

    return wait_for(drained, timeout=180, message=message)


def position_keys() -> list[int]:
    return claims.number_keys(RECORDED.name, [e.position for e in pgmsg.read_stream("records-1")])


def test_with_no_crash_on_record_the_handlers_run_while_the_record_commits():
    pgmsg.append("records-1", [Step(n=1), Step(n=2)])
    worker = drain_until(lambda: len(seen) == 2, "both steps handled")
    assert seen == [(1, True), (2, True)]  # the answer was not awaited
    # The record is there, with the batch's events, its batch committed; the worker's next
    # record replaces it (the answer named its row).
    assert claims_on_record() == [("event", position_keys(), "committed")]
    assert worker.claim_row is not None


def test_with_a_crash_on_record_the_handlers_wait_for_the_records_answer():
    record_claim("event", [-1], ended_transaction_id(commit=False))  # other events'
    pgmsg.append("records-1", [Step(n=1), Step(n=2)])
    drain_until(lambda: len(seen) == 2, "both steps handled")
    # Answered before the first handler: none of them is a suspect, so they ran together.
    assert seen == [(1, False), (2, False)]
    on_record = claims_on_record()
    assert ("event", position_keys(), "committed") in on_record
    assert ("event", [-1], "aborted") in on_record


def test_a_handler_failing_while_the_record_commits_leaves_no_crash_behind():
    # The failure rolls the batch back on purpose (batch.Redo): its claim is withdrawn on the
    # side connection, once the record's answer is read, and the batch runs again with a
    # savepoint per event, which records the failure on the partition.
    pgmsg.append("records-1", [Step(n=1, fail=True), Step(n=2)])
    drain_until(
        lambda: SubscriptionPartition.objects.get(subscription=RECORDED.name).attempts == 1,
        "the failure recorded",
    )
    # On the fast path while the record was on its way, then again with savepoints.
    assert seen == [(1, True), (1, True)]
    [partition] = SubscriptionPartition.objects.filter(subscription=RECORDED.name)
    assert "fails until fixed" in partition.last_error
    assert [status for _, _, status in claims_on_record()] == ["committed"]
    # Fixed, the retry (after its backoff) handles both, with no crash on record.
    failing["on"] = False
    drain_until(lambda: [n for n, _ in seen[-2:]] == [1, 2], "handled on the retry")
    assert seen[-2:] == [(1, True), (2, True)]
