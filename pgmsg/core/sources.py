"""What the worker drains: the source protocol, and the capabilities' source factories.

Each capability registers a factory under the keyword that selects it on ``Worker(...)`` and
``manage.py listen`` (``channel_names``, ``inboxes``, ``subscriptions``, ...); the app config
does the registering, so this core never imports a capability.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import psycopg
from django.db import connections


class Worker(Protocol):
    """What a source sees of the worker that runs it (pgmsg.core.worker.Worker)."""

    #: The database alias that holds the tables and runs the handlers.
    database: str
    #: Most rows to claim per batch.
    batch_size: int
    #: Set when the worker was asked to stop: finish the row in hand, claim nothing more.
    stopping: bool
    #: Rows handled so far (sources add to it).
    handled: int
    #: The transaction id of the last batch whose claim was recorded (pgmsg/core/claims.py).
    last_claim: int | None
    #: The pgmsg_claim row of the worker's last record, which its next record replaces when
    #: that batch committed (None before its first record).
    claim_row: int | None
    #: The claim record sent on the side connection whose answer was not read yet, if any
    #: (claims.send_record): read before the side connection's next use.
    record_in_flight: Any
    #: Every source the worker serves, in the order it serves them.
    sources: list
    #: Counts of committed batches not yet in pgmsg_throughput (core/throughput.py), or None:
    #: each batch then writes its counts in its own transaction.
    tally: Any

    def side_connection(self) -> psycopg.Connection | None:
        """An autocommit connection of the worker's own, for writes that must commit apart
        from the batch transaction (claims, see pgmsg/core/claims.py); None when the worker
        is not running."""

    def withdraw_claim(self) -> None:
        """Forget the crash record of the batch in hand, which is about to roll back on
        purpose (batch.Redo): it is no crash (pgmsg/core/claims.py)."""


class Source(Protocol):
    """A table of stored messages that the worker drains."""

    #: Shown in logs and in the worker's start line.
    label: str
    #: The wake payloads its producers pass to ``pgmsg_wake()`` (pgmsg/core/wake.py): while
    #: the worker sleeps it declares itself idle for these, and producers NOTIFY only then.
    #: Optional: a source without it is never declared idle, so its producers must NOTIFY
    #: themselves (or it waits for the sweep).
    wake_payloads: list[str]

    def wants(self, wake_payload: str) -> bool:
        """Whether a NOTIFY on the wake channel with this payload concerns this source."""

    def process_batch(self, worker: Worker) -> int:
        """Claim up to ``worker.batch_size`` due messages, handle them, commit; return the count
        claimed. Must stop handling (leaving the rest unclaimed) once ``worker.stopping``."""

    def seconds_until_due(self, worker: Worker) -> float | None:
        """Seconds until the next delayed message is due; None if nothing waits."""

    # Optional: ``close()``, called when the worker closes its database connections (a
    # source that holds connections of its own, such as an inbox bridge's broker connection).


class NotifySource(Source, Protocol):
    """A source that also takes payloads straight from NOTIFY channels of its own."""

    #: NOTIFY channels to LISTEN on besides the wake channel.
    notify_channels: list[str]

    def on_notify(self, worker: Worker, channel: str, payload: str) -> None:
        """Handle a payload that arrived on one of ``notify_channels``."""


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """What a worker was asked to serve, handed to each capability's source factory."""

    #: Nothing was named: serve everything that has a handler.
    serve_all: bool
    #: Names given per selecting keyword (``{"inboxes": ["a"]}``); a keyword not given is absent.
    selected: Mapping[str, list[str]]
    #: (i, N): take only share i of N (static partitioning), or None for all.
    partition: tuple[int, int] | None

    def named(self, keyword: str) -> list[str] | None:
        """The names given for ``keyword``, or None when it was not given."""
        return self.selected.get(keyword)


Factory = Callable[[SourceOptions], Iterable[Source]]

#: Source factories by selecting keyword, in registration order (the order sources are served).
factories: dict[str, Factory] = {}


def register(keyword: str, factory: Factory) -> None:
    """Let ``Worker(**{keyword: names})`` and the worker's defaults reach a capability's sources."""
    factories[keyword] = factory


def build(options: SourceOptions) -> list[Source]:
    return [source for factory in factories.values() for source in factory(options)]


def query_value(worker: Worker, statement: str, params: Mapping[str, Any]) -> Any:
    """The single value of a one-row, one-column statement (e.g. seconds until due)."""
    with connections[worker.database].cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchone()[0]
