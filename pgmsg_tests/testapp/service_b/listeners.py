"""B's inbox and its handler: one Effect row per handled message, in the handler's
transaction, so a duplicate effect or a lost one shows in B's database."""

from __future__ import annotations

import os

import pgmsg
from pgmsg_tests.testapp.models import Effect

INBOX = "proof.http"
proof = pgmsg.Inbox(INBOX, ordered=True, max_attempts=3)


@proof.handler("tick")
def tick(message: pgmsg.InboxMessage) -> None:
    Effect.objects.create(
        channel=INBOX,
        key=message.message_id,
        listener=message.aggregate_id or "",
        data={"seq": message.payload["seq"], "inbox_id": message.id},
        worker_pid=os.getpid(),
    )
