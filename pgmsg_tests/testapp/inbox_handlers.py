"""Inboxes and handlers used by the inbox tests: each handler records its effect in Effect.

Behaviour is driven by the payload so tests can ask for failures and delays:
``die`` (SIGKILL the worker process), ``sleep`` (seconds), ``sleep_max`` (a random delay up to
it), ``fail_times`` (raise while the delivery's attempts are below it),
``fail_unless_fixed`` (raise until an Effect with key "fixed:<message_id>" exists).
"""

import os
import random
import signal
import time

from django.db import connection

import pgmsg
from pgmsg_tests.testapp.inbox_models import WebhookEvent
from pgmsg_tests.testapp.models import Effect

work = pgmsg.Inbox("test.inbox", max_attempts=3, priorities={"urgent": 0, "normal": 5})
ordered = pgmsg.Inbox("test.ordered", ordered=True, max_attempts=2)
# No priority map: claimed in arrival order (inbox.sql, claim_unordered_fifo).
fifo = pgmsg.Inbox("test.fifo", max_attempts=3)
# A priority level of two types (inbox.sql, claim_types).
levels = pgmsg.Inbox("test.levels", priorities={"a": 0, "b": 0, "c": 1})


def _behave(message) -> None:
    payload = message.payload if isinstance(message.payload, dict) else {}
    if payload.get("die"):  # like a segfault or the OOM killer
        os.kill(os.getpid(), signal.SIGKILL)
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    if payload.get("sleep_max"):
        time.sleep(random.uniform(0, payload["sleep_max"]))
    if message.attempts < payload.get("fail_times", 0):
        raise RuntimeError(f"{message.message_id} fails on attempt {message.attempts + 1}")
    if (
        payload.get("fail_unless_fixed")
        and not Effect.objects.filter(key=f"fixed:{message.message_id}").exists()
    ):
        raise RuntimeError(f"{message.message_id} is not fixed yet")


@work.handler("work", "urgent", "normal", "low")
def record(message: pgmsg.InboxMessage) -> None:
    _behave(message)
    Effect.objects.create(
        channel="inbox:test.inbox",
        key=message.message_id,
        listener=message.type,
        data={
            "aggregate": message.aggregate_id,
            "attempts": message.attempts,
            "trace_id": message.trace_id,
            "source": message.source,
            "payload": message.payload,
            "received_at": message.received_at.isoformat(),
        },
        worker_pid=os.getpid(),
    )


@fifo.handler("work")
@levels.handler("a", "b", "c", "x")
def record_fifo(message: pgmsg.InboxMessage) -> None:
    _behave(message)
    Effect.objects.create(
        channel=f"inbox:{message.inbox}",
        key=message.message_id,
        listener=message.type,
        data={"attempts": message.attempts},
        worker_pid=os.getpid(),
    )


@ordered.handler("step")
def record_step(message: pgmsg.InboxMessage) -> None:
    """Records, besides the effect, whether ordering was kept: the previous step of the
    aggregate must be committed already, and no other session may be in this aggregate now
    (a session-level advisory lock in a key space of its own)."""
    seq = message.payload["seq"]
    aggregate = message.aggregate_id
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(4242, hashtext(%s))", [aggregate])
        alone = cursor.fetchone()[0]
    try:
        previous_done = (
            seq == 0
            or Effect.objects.filter(
                channel="inbox:test.ordered", key=f"{aggregate}:{seq - 1}"
            ).exists()
        )
        already = Effect.objects.filter(
            channel="inbox:test.ordered", key=f"{aggregate}:{seq}"
        ).exists()
        _behave(message)
        Effect.objects.create(
            channel="inbox:test.ordered",
            key=f"{aggregate}:{seq}",
            listener="step",
            data={"alone": alone, "previous_done": previous_done, "already": already},
            worker_pid=os.getpid(),
        )
    finally:
        if alone:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(4242, hashtext(%s))", [aggregate])


webhooks = pgmsg.ModelInbox(
    "test.webhooks",
    model=WebhookEvent,
    id_field="event_id",
    type_field="kind",
    processed_field="processed_at",
    aggregate_field="account",
    max_attempts=2,
)


@webhooks.handler("charge", "refund")
def record_webhook(message: pgmsg.InboxMessage) -> None:
    event = message.payload  # the WebhookEvent row
    _behave(
        type(
            "Behave",
            (),
            {"payload": event.body, "attempts": message.attempts, "message_id": message.message_id},
        )()
    )
    Effect.objects.create(
        channel="inbox:test.webhooks",
        key=message.message_id,
        listener=message.type,
        data={"pk": event.pk, "account": event.account},
        worker_pid=os.getpid(),
    )


from pgmsg_tests.testapp import inbox_bench  # noqa: E402,F401  (bench/inbox.py's inboxes)
