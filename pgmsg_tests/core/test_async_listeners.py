"""``async def`` listeners and handlers: their async ORM writes and the acknowledgement commit
together, roll back together, and die together with a killed worker.

The handlers are in pgmsg_tests/testapp/async_handlers.py; each writes an Effect row with
``acreate`` recording the delivery's attempts, so a write that survived a failed attempt shows
as an Effect with a lower attempt count.
"""

from __future__ import annotations

import asyncio
import os
import signal

import psycopg
import pytest
from django.core.exceptions import SynchronousOnlyOperation
from django.db import connection, transaction

import pgmsg
from pgmsg.core import asynchrony
from pgmsg.core.worker import Worker
from pgmsg.models import InboxMessage, Notification
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.helpers import drain
from pgmsg_tests.testapp.async_handlers import AsyncStep, AsyncWork
from pgmsg_tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def attempts_seen(channel: str) -> dict[str, list[int]]:
    """The attempt numbers of the committed Effect rows, by key."""
    seen: dict[str, list[int]] = {}
    for key, data in (
        Effect.objects.filter(channel=channel).order_by("id").values_list("key", "data")
    ):
        seen.setdefault(key, []).append(data["attempts"])
    return seen


def drained(channel: str, keys: int, run) -> dict[str, list[int]]:
    """Run ``run`` (one in-process drain) until ``keys`` keys have a committed effect."""
    wait_for(
        lambda: (run(), len(attempts_seen(channel)) >= keys)[1],
        timeout=60,
        message=f"{keys} effects on {channel}",
    )
    return attempts_seen(channel)


def test_an_async_listener_commits_its_orm_write_with_the_acknowledgement():
    pgmsg.notify(AsyncWork(key="ok"))
    drain("test.async_work")
    assert attempts_seen("test.async_work") == {"ok": [0]}
    assert not Notification.objects.exists()


def test_an_async_listener_that_raises_leaves_no_write_and_its_message_is_retried():
    pgmsg.notify(AsyncWork(key="flaky", fail_times=2))
    seen = drained("test.async_work", 1, lambda: drain("test.async_work"))
    # The writes of attempts 0 and 1 rolled back with their failures; attempt 2 committed.
    assert seen == {"flaky": [2]}
    assert not Notification.objects.exists()


def test_an_async_listener_failing_in_a_batch_charges_only_its_own_message():
    pgmsg.notify_many(
        [AsyncWork(key="first"), AsyncWork(key="bad", fail_times=1), AsyncWork(key="last")]
    )
    seen = drained("test.async_work", 3, lambda: drain("test.async_work", batch_size=10))
    assert seen == {"first": [0], "bad": [1], "last": [0]}


def test_an_async_inbox_handler_commits_or_rolls_back_with_the_processed_mark():
    pgmsg.receive("test.async_inbox", "in-ok", type="work", payload={})
    pgmsg.receive("test.async_inbox", "in-flaky", type="work", payload={"fail_times": 1})

    def run() -> None:
        Worker(inboxes=["test.async_inbox"], until_idle=True, install_signal_handlers=False).run()

    assert drained("inbox:test.async_inbox", 2, run) == {"in-ok": [0], "in-flaky": [1]}
    statuses = InboxMessage.objects.filter(inbox="test.async_inbox").values_list(
        "status", flat=True
    )
    assert set(statuses) == {"processed"}


def test_an_async_subscription_handler_moves_the_checkpoint_with_its_writes():
    pgmsg.append("asyncstep-1", [AsyncStep(n=1), AsyncStep(n=2, fail_times=1), AsyncStep(n=3)])

    def run() -> None:
        Worker(subscriptions=["test-async"], until_idle=True, install_signal_handlers=False).run()

    seen = drained("sub.async", 3, run)
    assert seen == {"step-1": [0], "step-2": [1], "step-3": [0]}


@pytest.mark.processes
def test_a_worker_killed_inside_an_async_listener_leaves_neither_its_write_nor_the_ack(
    workers, tmp_path
):
    hold = tmp_path / "holding"
    pgmsg.notify(AsyncWork(key="killed", hold=str(hold)))
    first = workers.start("test.async_work")
    wait_for(hold.exists, timeout=60, message="the async listener wrote and is holding")
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    # Its acreate ran before the hold: it died uncommitted with the worker's transaction.
    assert not Effect.objects.filter(channel="test.async_work").exists()
    assert Notification.objects.filter(channel="test.async_work").count() == 1

    workers.start("test.async_work")  # the hold file exists now: the retry goes through
    wait_for(
        lambda: not Notification.objects.filter(channel="test.async_work").exists(),
        timeout=60,
        message="the second worker handled the message",
    )
    assert list(Effect.objects.filter(channel="test.async_work").values_list("key", flat=True)) == [
        "killed"
    ]


def test_a_sync_orm_call_in_an_async_handler_raises_djangos_error():
    async def handler(message: object) -> None:
        Effect.objects.create(channel="never", key="sync-in-async")

    with pytest.raises(SynchronousOnlyOperation):
        asynchrony.in_worker_thread(handler)(None)


def test_the_limit_a_write_on_a_connection_of_the_handlers_own_is_outside_the_transaction():
    """Documented in docs/async.md: it commits on its own and survives the batch's rollback."""
    url = database_url(connection.settings_dict)

    async def handler(message: object) -> None:
        await Effect.objects.acreate(channel="limit", key="in the transaction")
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as own:
            await own.execute(
                "INSERT INTO testapp_effect (channel, key, listener, data, worker_pid) "
                "VALUES ('limit', 'own connection', '', '{}', 0)"
            )

    with transaction.atomic():
        asynchrony.in_worker_thread(handler)(None)
        transaction.set_rollback(True)  # as a failed batch does
    keys = Effect.objects.filter(channel="limit").values_list("key", flat=True)
    assert list(keys) == ["own connection"]


def test_an_object_whose_call_is_async_def_is_run_as_an_async_handler():
    class Handler:
        async def __call__(self, message: str) -> str:
            await asyncio.sleep(0)
            return message.upper()

    assert asynchrony.in_worker_thread(Handler())("ran") == "RAN"


def test_a_task_an_async_handler_leaves_running_is_cancelled_when_it_returns():
    ended: list[str] = []

    async def background() -> None:
        try:
            await asyncio.sleep(60)
            ended.append("finished")
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    async def handler(message: object) -> None:
        handler.task = asyncio.create_task(background())  # type: ignore[attr-defined]
        await asyncio.sleep(0)

    asynchrony.in_worker_thread(handler)(None)
    assert ended == ["cancelled"]
