"""An inbox message whose handler kills its worker process is counted, isolated from its
batch and made dead; the other messages of its batch are handled once (real processes)."""

from collections import Counter

import pytest

import pgmsg
from pgmsg.models import InboxMessage
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.testapp.inbox_models import WebhookEvent
from pgmsg_tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def nothing_due(inbox: str) -> bool:
    """Nothing pending that a worker could still run (an ordered aggregate behind a dead head
    is held back on purpose)."""
    pending = InboxMessage.objects.filter(inbox=inbox, status="pending")
    dead_aggregates = InboxMessage.objects.filter(inbox=inbox, status="dead").values("aggregate_id")
    return not pending.exclude(aggregate_id__in=dead_aggregates).exists()


def run_until_settled(workers, inbox: str) -> int:
    """Start a worker, again each time it dies, until nothing is due; returns the deaths."""
    deaths = 0
    while not nothing_due(inbox):
        proc = workers.start("--inbox", inbox, "--batch-size", "50")
        wait_for(
            lambda proc=proc: proc.poll() is not None or nothing_due(inbox),
            timeout=60,
            message="the worker dies or everything is settled",
        )
        if proc.poll() is not None:
            deaths += 1
        assert deaths <= 4, "the poison must be isolated and made dead after max_attempts"
    return deaths


def test_an_unordered_inbox_isolates_a_message_that_kills_its_worker(workers):
    messages = [
        {"message_id": f"m{i}", "type": "work", "payload": {"die": i == 10}} for i in range(21)
    ]
    pgmsg.receive_many("test.inbox", messages)
    # The batch of 21 died uncharged (its rows suspects), then the poison alone 3 times
    # (test.inbox has max_attempts=3).
    assert run_until_settled(workers, "test.inbox") == 4
    poison = InboxMessage.objects.get(message_id="m10")
    assert poison.status == "dead"
    assert "worker process died while handling it (3 time(s))" in poison.last_error
    counts = Counter(
        Effect.objects.filter(channel="inbox:test.inbox").values_list("key", flat=True)
    )
    assert counts == {f"m{i}": 1 for i in range(21) if i != 10}


def test_an_ordered_inbox_isolates_it_and_keeps_its_aggregate_behind_it(workers):
    def step(aggregate, seq, die=False):
        return {
            "message_id": f"{aggregate}-{seq}",
            "type": "step",
            "aggregate_id": aggregate,
            "payload": {"seq": seq, "die": die},
        }

    pgmsg.receive_many(
        "test.ordered",
        [step("y", 0), step("x", 0), step("y", 1), step("x", 1, die=True), step("y", 2)]
        + [step("x", 2), step("y", 3)],
    )
    # Its batch died uncharged, then it alone twice (test.ordered: max_attempts=2).
    assert run_until_settled(workers, "test.ordered") == 3
    states = dict(InboxMessage.objects.values_list("message_id", "status"))
    assert states == {
        "y-0": "processed", "y-1": "processed", "y-2": "processed", "y-3": "processed",
        "x-0": "processed", "x-1": "dead", "x-2": "pending",
    }  # fmt: skip
    keys = list(
        Effect.objects.filter(channel="inbox:test.ordered")
        .order_by("id")
        .values_list("key", flat=True)
    )
    assert sorted(keys) == ["x:0", "y:0", "y:1", "y:2", "y:3"]
    assert [k for k in keys if k.startswith("y")] == ["y:0", "y:1", "y:2", "y:3"]
    assert all(e.data["previous_done"] for e in Effect.objects.filter(key__startswith="y"))


def test_a_model_inbox_isolates_a_row_that_kills_its_worker(workers):
    WebhookEvent.objects.bulk_create(
        WebhookEvent(event_id=f"w{i}", kind="charge", body={"die": i == 7}) for i in range(15)
    )

    def settled() -> bool:
        dead = InboxMessage.objects.filter(inbox="test.webhooks", status="dead")
        unprocessed = WebhookEvent.objects.filter(processed_at=None)
        return not unprocessed.exclude(event_id__in=dead.values("message_id")).exists()

    deaths = 0
    while not settled():
        proc = workers.start("--inbox", "test.webhooks", "--batch-size", "50")
        wait_for(
            lambda proc=proc: proc.poll() is not None or settled(),
            timeout=60,
            message="the worker dies or every row is settled",
        )
        if proc.poll() is not None:
            deaths += 1
        assert deaths <= 3, "the poison must be isolated and made dead after max_attempts"
    assert deaths == 3  # its batch, uncharged, then it alone twice (max_attempts=2)
    record = InboxMessage.objects.get(inbox="test.webhooks", message_id="w7")
    assert record.status == "dead"
    assert "worker process died while handling it (2 time(s))" in record.last_error
    assert WebhookEvent.objects.get(event_id="w7").processed_at is None
    counts = Counter(
        Effect.objects.filter(channel="inbox:test.webhooks").values_list("key", flat=True)
    )
    assert counts == {f"w{i}": 1 for i in range(15) if i != 7}
