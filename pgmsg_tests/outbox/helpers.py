"""Helpers of the outbox tests: run a relay in this process, read the outbox table."""

from __future__ import annotations

from pgmsg.core.worker import Worker
from pgmsg.models import OutboxMessage


def relay(*outboxes: str, batch_size: int | None = None) -> Worker:
    """Run an in-process relay until nothing is due, and return it."""
    worker = Worker(
        outboxes=list(outboxes),
        until_idle=True,
        install_signal_handlers=False,
        batch_size=batch_size,
    )
    worker.run()
    return worker


def rows(outbox: str):
    return OutboxMessage.objects.filter(outbox=outbox).order_by("id")


def make_due_now(outbox: str) -> None:
    """Skip retry backoff (tests must not wait out delays)."""
    from django.db.models.functions import Now

    OutboxMessage.objects.filter(outbox=outbox, status="pending").update(available_at=Now())
