"""A channel, an inbox and a subscription whose handlers are ``async def`` (docs/async.md).

Each handler writes its Effect with Django's async ORM, then behaves as its message asks:
``fail_times``: raise while the delivery's attempts are below it; ``hold``: a file path that,
while absent, the handler creates and then sleeps (a test kills its worker there).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pgmsg
from pgmsg_tests.testapp.models import Effect


class AsyncWork(pgmsg.Channel, name="test.async_work", max_attempts=3):
    key: str
    fail_times: int = 0
    hold: str = ""


async def _effect_then_behave(channel: str, key: str, *, fail_times: int, hold: str) -> None:
    attempts = pgmsg.current_delivery().attempts
    await Effect.objects.acreate(
        channel=channel, key=key, data={"attempts": attempts}, worker_pid=os.getpid()
    )
    if attempts < fail_times:
        raise RuntimeError(f"{key} fails on attempt {attempts + 1}")
    if hold and not Path(hold).exists():
        Path(hold).touch()
        await asyncio.sleep(120)


@pgmsg.listener(AsyncWork)
async def record_async_work(message: AsyncWork) -> None:
    await _effect_then_behave(
        "test.async_work", message.key, fail_times=message.fail_times, hold=message.hold
    )


inbox = pgmsg.Inbox("test.async_inbox", max_attempts=3)


@inbox.handler("work")
async def record_async_inbox(message: pgmsg.InboxMessage) -> None:
    await _effect_then_behave(
        "inbox:test.async_inbox",
        message.message_id,
        fail_times=message.payload.get("fail_times", 0),
        hold="",
    )


class AsyncStep(pgmsg.Event, type="test.async_step"):
    n: int
    fail_times: int = 0


subscription = pgmsg.Subscription("test-async", category="asyncstep", partitions=1)


@subscription.handler(AsyncStep)
async def record_async_step(recorded: pgmsg.RecordedEvent) -> None:
    step = recorded.event
    await _effect_then_behave("sub.async", f"step-{step.n}", fail_times=step.fail_times, hold="")
