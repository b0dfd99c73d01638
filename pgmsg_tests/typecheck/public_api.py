"""pgmsg's public API used as the README shows it, for mypy (`make typecheck`); never run.

mypy checks this file and ``pgmsg/__init__.py`` (what the package re-exports) against the
signatures pgmsg declares, as a user's type checker would see them through ``py.typed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import pgmsg


class OrderPaid(pgmsg.Channel, name="typecheck.order_paid"):
    order_id: int
    amount: Decimal


@pgmsg.listener(OrderPaid)
def write_invoice(message: OrderPaid) -> None:
    delivery = pgmsg.current_delivery()
    if delivery is not None:
        attempts: int = delivery.attempts
        print(attempts)


@pgmsg.listener("typecheck.order_changed")
def ship(change: pgmsg.RowChange) -> None:
    print(change.operation)


def send() -> int | None:
    sent: int = pgmsg.notify_many([OrderPaid(order_id=1, amount=Decimal("2"))])
    print(sent)
    return pgmsg.notify(OrderPaid(order_id=1, amount=Decimal("2")), using="default")


payments = pgmsg.Inbox("typecheck_payments", ordered=True)


@payments.handler("payment.captured")
def on_captured(message: pgmsg.InboxMessage) -> None:
    print(message.message_id, message.payload, message.attempts)


def receive() -> bool:
    result = pgmsg.receive(
        "typecheck_payments", "evt_1", type="payment.captured", payload={"a": 1}, aggregate_id="p"
    )
    return result.duplicate


class Deposited(pgmsg.Event, type="typecheck.deposited"):
    amount: Decimal


def deposit() -> None:
    pgmsg.append("account-1", [Deposited(amount=Decimal("10"))], expected_version=pgmsg.NO_STREAM)
    for recorded in pgmsg.read_stream("account-1"):
        print(recorded.version, recorded.type)


ledger = pgmsg.Subscription("typecheck_ledger", category="account", partitions=4)


@ledger.handler(Deposited)
def project(recorded: pgmsg.RecordedEvent) -> None:
    print(recorded.position)


@dataclass
class Config:
    worker: pgmsg.Worker


def run() -> None:
    worker = pgmsg.Worker(inboxes=["typecheck_payments"], until_idle=True)
    worker.run()
    try:
        pgmsg.replay([1])
    except pgmsg.errors.PgmsgError as exc:
        print(exc)


@pgmsg.listener(OrderPaid)
async def write_invoice_async(message: OrderPaid) -> None:
    print(message.order_id)


async def from_an_async_view() -> None:
    stored: int | None = await pgmsg.anotify(OrderPaid(order_id=1, amount=Decimal("2")))
    sent: int = await pgmsg.anotify_many([OrderPaid(order_id=2, amount=Decimal("2"))])
    received = await pgmsg.areceive("typecheck_payments", "evt_2", type="t", payload={})
    many = await pgmsg.areceive_many("typecheck_payments", [{"message_id": "e", "type": "t"}])
    published = await pgmsg.apublish("typecheck_orders", {"a": 1}, type="order.placed")
    several = await pgmsg.apublish_many([])
    version: int = await pgmsg.aappend("account-2", Deposited(amount=Decimal("1")))
    events = await pgmsg.aread_stream("account-2", limit=10)
    after = await pgmsg.aread_all(events[-1].checkpoint, category="account")
    print(stored, sent, received.duplicate, many, published.stored, several, version, after)
