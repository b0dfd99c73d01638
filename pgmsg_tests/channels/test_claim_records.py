"""The claim record of a batch of stored notifications (pgmsg/core/claims.py) while its
listeners run: without a claim of notifications whose batch died on record, they run while the
record commits, and its answer is read after the batch's COMMIT; with one on record, they wait
for the answer. A listener failing while the record is on its way is tested in
core/test_worker_failures.py (test_a_fast_path_failure_is_never_taken_for_a_crash), a listener
killing its worker in test_a_message_that_kills_its_worker_dies_alone_... there."""

import pytest
from django.db import connection

import pgmsg
from pgmsg.core.worker import Worker
from pgmsg.models import Notification
from pgmsg_tests.helpers import claims_on_record, ended_transaction_id, record_claim

pytestmark = pytest.mark.django_db(transaction=True)


class Recorded(pgmsg.Channel, name="test.claimrecords"):
    n: int


#: What each call of the listener saw: (n, whether its batch's record was still on its way).
seen: list[tuple[int, bool]] = []
running: dict[str, Worker] = {}


@pgmsg.listener(Recorded)
def note(message: Recorded) -> None:
    seen.append((message.n, running["worker"].record_in_flight is not None))


@pytest.fixture(autouse=True)
def clean():
    seen.clear()
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM pgmsg_claim")
    yield
    running.clear()


def drain() -> Worker:
    worker = running["worker"] = Worker(
        channel_names=[Recorded.pgmsg_channel.name],
        until_idle=True,
        install_signal_handlers=False,
    )
    worker.run()
    assert worker.record_in_flight is None  # every answer was read by the batch's end
    return worker


def test_with_no_crash_on_record_the_listeners_run_while_the_record_commits():
    ids = [pgmsg.notify(Recorded(n=n)) for n in (1, 2)]
    worker = drain()
    assert seen == [(1, True), (2, True)]  # the answer was not awaited
    assert not Notification.objects.exists()
    assert claims_on_record() == [("notification", ids, "committed")]
    assert worker.claim_row is not None  # from the answer: the next record replaces this one


@pytest.mark.parametrize("kind", ["notification", "event"])
def test_only_a_crash_of_the_same_kind_on_record_makes_the_listeners_wait(kind):
    record_claim(kind, [-1], ended_transaction_id(commit=False))
    ids = [pgmsg.notify(Recorded(n=n)) for n in (1, 2)]
    drain()
    waited = kind == "notification"
    # Answered before the first listener when it may name suspects (none here: both ran).
    assert seen == [(1, not waited), (2, not waited)]
    assert ("notification", ids, "committed") in claims_on_record()
