"""Event types, aggregates and subscriptions of the event-store tests; effects go to Effect."""

from __future__ import annotations

import os
import signal
import time
from decimal import Decimal

import pgmsg
from pgmsg_tests.testapp.models import Effect


class Deposited(pgmsg.Event, type="test.deposited"):
    amount: Decimal


class Withdrawn(pgmsg.Event, type="test.withdrawn"):
    amount: Decimal


class Opened(pgmsg.Event, type="test.opened"):
    owner: str


class Step(pgmsg.Event, type="test.step"):
    """A numbered step of a test; handlers may sleep on it or fail on it."""

    n: int
    sleep: float = 0.0
    fail: bool = False
    tag: str = ""


class Account(pgmsg.Aggregate, category="account"):
    def __init__(self, id: str) -> None:
        super().__init__(id)
        self.owner: str | None = None
        self.balance = Decimal(0)

    def open(self, owner: str) -> None:
        if self.owner is not None:
            raise ValueError(f"account {self.id} is open already")
        self.record(Opened(owner=owner))

    def deposit(self, amount: Decimal) -> None:
        self.record(Deposited(amount=amount))

    def withdraw(self, amount: Decimal) -> None:
        if amount > self.balance:
            raise ValueError(f"account {self.id}: balance {self.balance} < {amount}")
        self.record(Withdrawn(amount=amount))

    def snapshot_state(self) -> dict:
        return {"owner": self.owner, "balance": str(self.balance)}

    def restore_state(self, state: dict) -> None:
        self.owner, self.balance = state["owner"], Decimal(state["balance"])

    def apply_opened(self, event: Opened) -> None:
        self.owner = event.owner

    def apply_deposited(self, event: Deposited) -> None:
        self.balance += event.amount

    def apply_withdrawn(self, event: Withdrawn) -> None:
        self.balance -= event.amount


def _record(channel: str, recorded: pgmsg.RecordedEvent, **data) -> None:
    Effect.objects.create(
        channel=channel,
        key=str(recorded.message_id),
        listener=recorded.stream_name,
        worker_pid=os.getpid(),
        data={"version": recorded.version, "position": recorded.position, **data},
    )


# Every event of the "seq" category, 4 partitions by stream: order and competing consumers.
seq = pgmsg.Subscription("test-seq", category="seq", partitions=4)


@seq.handler(Step)
def record_seq(recorded: pgmsg.RecordedEvent) -> None:
    if recorded.event.sleep:
        time.sleep(recorded.event.sleep)
    _record("sub.seq", recorded, n=recorded.event.n)


# Everything in the store, one partition: the gap-free reading test.
audit = pgmsg.Subscription("test-audit", partitions=1)


@audit.handler()
def record_audit(recorded: pgmsg.RecordedEvent) -> None:
    _record("sub.audit", recorded)


# Ledger balances from account events (only two types handled; Opened is not read).
ledger = pgmsg.Subscription("test-ledger", category="account", partitions=2)


@ledger.handler(Deposited, Withdrawn)
def record_ledger(recorded: pgmsg.RecordedEvent) -> None:
    event = recorded.event
    sign = 1 if isinstance(event, Deposited) else -1
    _record("sub.ledger", recorded, amount=str(sign * event.amount))
    # A handler's own appends record their cause.
    if recorded.event.amount >= 1000:
        pgmsg.append(f"audit-{recorded.stream_name}", Step(n=recorded.version, tag="large"))


# Fails on steps marked fail=True until a "switch" effect exists for the step's tag.
fragile = pgmsg.Subscription("test-fragile", category="fragile", partitions=2, max_attempts=2)


@fragile.handler(Step)
def record_fragile(recorded: pgmsg.RecordedEvent) -> None:
    step = recorded.event
    _record("sub.fragile", recorded, n=step.n)
    if step.fail and not Effect.objects.filter(channel="switch", key=step.tag).exists():
        raise RuntimeError(f"step {step.n} of {recorded.stream_name} fails")


# Starts from now: events stored before its partitions exist are passed over.
late = pgmsg.Subscription("test-late", category="late", partitions=1, start="now")


@late.handler(Step)
def record_late(recorded: pgmsg.RecordedEvent) -> None:
    _record("sub.late", recorded, n=recorded.event.n)


# Kills its own worker process on a step tagged "die" (like a segfault or the OOM killer).
crash = pgmsg.Subscription("test-crash", category="crash", partitions=1, max_attempts=2)


@crash.handler(Step)
def record_crash(recorded: pgmsg.RecordedEvent) -> None:
    if recorded.event.tag == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    _record("sub.crash", recorded, n=recorded.event.n)
