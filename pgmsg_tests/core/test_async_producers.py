"""The async producers: the sync functions' signatures and errors, and the transaction each joins.

Requests go through Django's own ASGI handler (one thread-sensitive context per request, as
under uvicorn or daphne); other async code runs under ``async_to_sync`` from the test's thread.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from decimal import Decimal

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.core.exceptions import SynchronousOnlyOperation
from django.core.handlers.asgi import ASGIHandler
from django.db import transaction
from django.test import override_settings

import pgmsg
from pgmsg.models import Notification, OutboxMessage, StoredEvent
from pgmsg_tests.testapp.channels import Shout, Work
from pgmsg_tests.testapp.events_handlers import Deposited
from pgmsg_tests.testapp.models import Order
from pgmsg_tests.testapp.outbox_declarations import OrderPlaced

SYNC_NAMES = [
    "notify",
    "notify_many",
    "publish",
    "publish_many",
    "receive",
    "receive_many",
    "append",
    "read_stream",
    "read_all",
]


@pytest.mark.parametrize("name", SYNC_NAMES)
def test_each_async_producer_has_its_sync_twins_signature(name):
    sync, async_ = getattr(pgmsg, name), getattr(pgmsg, f"a{name}")
    assert inspect.iscoroutinefunction(async_)
    assert inspect.signature(async_) == inspect.signature(sync)
    assert async_.__name__ == f"a{name}" and sync.__doc__ in async_.__doc__


E = pgmsg.errors
BAD_CALLS = [
    ("notify", (object(),), {}, E.UnknownChannel),
    ("notify", (Shout(text="x" * 9000),), {}, E.PayloadTooLarge),
    ("notify_many", ([Work(key="w"), "not a message"],), {}, E.UnknownChannel),
    ("publish", ("no.such.outbox", {}), {"type": "t"}, E.UnknownOutbox),
    ("publish", (OrderPlaced(order_id=1, total=Decimal(1)), {}), {}, E.InvalidOutboxMessage),
    ("publish_many", ([(OrderPlaced(1, Decimal(1)), {"bogus": 1})],), {}, E.InvalidOutboxMessage),
    ("receive", ("no.such.inbox", "m1"), {"type": "t", "payload": {}}, E.UnknownInbox),
    ("receive", ("test.inbox", "m1"), {"type": "", "payload": {}}, E.InvalidMessage),
    ("receive_many", ("test.inbox", [{"type": "t"}]), {}, E.InvalidMessage),
    ("append", ("not a stream!", Deposited(amount=Decimal(1))), {}, E.InvalidName),
    ("append", ("account-1", []), {}, E.PayloadError),
    ("append", ("account-1", "not an event"), {}, E.PayloadError),
    ("notify", (Work(key=1),), {}, E.PayloadError),
    ("publish", (object(),), {}, E.InvalidOutboxMessage),
    ("publish", ("test.recorded", {"x": float("nan")}), {"type": "t"}, E.InvalidOutboxMessage),
    ("receive", ("test.inbox", "m2"), {"type": "t", "payload": {"x": object()}}, E.InvalidMessage),
    ("append", ("account-1", pgmsg.Event()), {}, E.PayloadError),
    ("read_stream", ("",), {}, E.InvalidName),
    ("read_all", ("not a checkpoint",), {}, E.InvalidCheckpoint),
]


def raised(call) -> BaseException:
    with pytest.raises(Exception) as info:
        call()
    return info.value


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("name", "args", "kwargs", "kind"), BAD_CALLS)
def test_async_producers_refuse_bad_input_with_the_sync_functions_errors(name, args, kwargs, kind):
    sync = raised(lambda: getattr(pgmsg, name)(*args, **kwargs))
    async_ = raised(lambda: async_to_sync(getattr(pgmsg, f"a{name}"))(*args, **kwargs))
    assert isinstance(sync, kind), repr(sync)
    assert type(async_) is type(sync) and str(async_) == str(sync)


@pytest.mark.django_db(transaction=True)
def test_a_version_conflict_raises_the_same_concurrency_error_and_writes_nothing():
    pgmsg.append("account-async1", Deposited(amount=Decimal(1)))
    with pytest.raises(E.ConcurrencyError) as info:
        async_to_sync(pgmsg.aappend)(
            "account-async1", Deposited(amount=Decimal(2)), expected_version=pgmsg.NO_STREAM
        )
    assert "account-async1" in str(info.value)
    assert StoredEvent.objects.filter(stream_name="account-async1").count() == 1


@pytest.mark.django_db(transaction=True)
def test_each_async_producer_writes_and_reads_what_its_sync_twin_does():
    async def scenario() -> dict:
        return {
            "notified": await pgmsg.anotify(Work(key="an")),
            "notified_many": await pgmsg.anotify_many([Work(key="b"), Work(key="c")]),
            "first": await pgmsg.areceive("test.inbox", "ar-1", type="work", payload={}),
            "again": await pgmsg.areceive("test.inbox", "ar-1", type="work", payload={}),
            "many": await pgmsg.areceive_many(
                "test.inbox", [{"message_id": "ar-2", "type": "work", "payload": {}}]
            ),
            "published": await pgmsg.apublish_many([OrderPlaced(order_id=5, total=Decimal(5))]),
            "version": await pgmsg.aappend(
                "account-async2", [Deposited(amount=Decimal(3)), Deposited(amount=Decimal(4))]
            ),
            "stream": await pgmsg.aread_stream("account-async2"),
            "all": await pgmsg.aread_all(category="account"),
        }

    got = async_to_sync(scenario)()
    assert Notification.objects.get(pk=got["notified"]).channel == "test.work"
    assert got["notified_many"] == 2 and Notification.objects.count() == 3
    assert got["first"].stored and got["again"].duplicate and got["many"][0].stored
    assert got["published"][0].stored and OutboxMessage.objects.count() == 1
    assert got["version"] == 2
    assert [e.version for e in got["stream"]] == [1, 2]
    assert [e.message_id for e in got["all"]] == [e.message_id for e in got["stream"]]
    assert [e.message_id for e in pgmsg.read_stream("account-async2")] == [
        e.message_id for e in got["stream"]
    ]


def asgi_get(path: str) -> tuple[int, dict]:
    """GET ``path`` through Django's ASGI handler (what uvicorn or daphne would call)."""
    sent: list[dict] = []

    async def request() -> None:
        asked = False

        async def receive() -> dict:
            nonlocal asked
            if asked:  # after the body, a client that stays until the response is done
                await asyncio.Event().wait()
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        target, _, query = path.partition("?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": target,
            "raw_path": target.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(b"host", b"testserver")],
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        await ASGIHandler()(scope, receive, send)

    asyncio.run(request())
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body)


ASYNC_VIEWS = override_settings(ROOT_URLCONF="pgmsg_tests.core.async_views", ALLOWED_HOSTS=["*"])


@ASYNC_VIEWS
@pytest.mark.django_db(transaction=True)
def test_an_awaited_publish_outside_a_transaction_is_committed_when_it_returns():
    status, body = asgi_get("/publish-alone")
    assert status == 200
    # A new connection saw it before the view went on: committed, not pending.
    assert body["seen_elsewhere"] == 1
    assert OutboxMessage.objects.filter(message_id=body["message_id"]).count() == 1


@ASYNC_VIEWS
@pytest.mark.django_db(transaction=True)
def test_the_documented_async_view_commits_the_order_and_its_message_together():
    status, body = asgi_get("/checkout?reference=async-1&total=9.90")
    assert status == 200
    order = Order.objects.get(pk=body["order"])
    assert order.reference == "async-1" and order.total == Decimal("9.90")
    [message] = OutboxMessage.objects.filter(outbox="test.recorded")
    assert message.payload["order_id"] == order.pk


@ASYNC_VIEWS
@pytest.mark.django_db(transaction=True)
def test_the_documented_async_view_rolls_the_order_and_its_message_back_together():
    assert asgi_get("/checkout?reference=async-2&total=1")[0] == 200
    status, body = asgi_get("/checkout?reference=async-2&total=2")
    assert (status, body) == (409, {"error": "duplicate reference"})
    assert Order.objects.filter(reference="async-2").count() == 1
    assert OutboxMessage.objects.filter(outbox="test.recorded").count() == 1


@pytest.mark.django_db(transaction=True)
def test_an_atomic_block_cannot_be_opened_in_async_code():
    async def view() -> None:
        with transaction.atomic():
            await Order.objects.acreate(reference="never")

    with pytest.raises(SynchronousOnlyOperation):
        async_to_sync(view)()
    assert not Order.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_async_calls_inside_an_atomic_block_run_on_its_connection_and_roll_back_with_it():
    """What Django 5.2 and 6.0 do with async ORM calls and ``a...`` functions awaited from
    inside a sync atomic block (through async_to_sync): they run back in the block's thread,
    on its connection, and so in its transaction."""

    async def writes(reference: str) -> None:
        order = await Order.objects.acreate(reference=reference)
        await pgmsg.apublish(OrderPlaced(order_id=order.pk, total=Decimal(1)))

    def in_one_transaction(reference: str, *, fail: bool) -> None:
        with transaction.atomic():
            async_to_sync(writes)(reference)
            if fail:
                raise RuntimeError("roll back")

    async def view(reference: str, *, fail: bool) -> None:
        await sync_to_async(in_one_transaction)(reference, fail=fail)

    with pytest.raises(RuntimeError):
        async_to_sync(view)("inner-1", fail=True)
    assert not Order.objects.exists() and not OutboxMessage.objects.exists()
    async_to_sync(view)("inner-2", fail=False)
    assert Order.objects.get().reference == "inner-2"
    assert OutboxMessage.objects.count() == 1
