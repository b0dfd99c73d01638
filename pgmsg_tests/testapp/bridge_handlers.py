"""Service B of the bridge tests: an ordered inbox fed by a bridge, whose handler records one
Effect per message (in its transaction), with the message's key and number."""

import os

import pgmsg
from pgmsg_tests.testapp.models import Effect

bridged = pgmsg.Inbox("test.bridged", ordered=True, max_attempts=3)


@bridged.handler("tick")
def record_tick(message: pgmsg.InboxMessage) -> None:
    payload = message.payload if isinstance(message.payload, dict) else {}
    Effect.objects.create(
        channel="test.bridged",
        key=message.message_id,
        listener="record_tick",
        data={"key": message.aggregate_id, "n": payload.get("n")},
        worker_pid=os.getpid(),
    )
