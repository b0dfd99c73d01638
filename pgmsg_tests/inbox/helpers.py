"""Shared by the inbox tests: an in-process drain and what handlers left behind."""

from collections import Counter

from django.db.models.functions import Now

from pgmsg.core.worker import Worker
from pgmsg.models import InboxMessage
from pgmsg_tests.testapp.models import Effect


def drain(*inboxes: str, batch_size: int | None = None, partition=None) -> Worker:
    worker = Worker(
        inboxes=list(inboxes) or ["test.inbox"],
        until_idle=True,
        install_signal_handlers=False,
        batch_size=batch_size,
        partition=partition,
    )
    worker.run()
    return worker


def effects(channel: str = "inbox:test.inbox") -> Counter:
    return Counter(Effect.objects.filter(channel=channel).values_list("key", flat=True))


def make_due_now() -> None:
    InboxMessage.objects.filter(status="pending").update(available_at=Now())


def status_of(message_id: str, inbox: str = "test.inbox") -> InboxMessage:
    return InboxMessage.objects.get(inbox=inbox, message_id=message_id)
