"""Event-sourced aggregates: state rebuilt from a stream, new events saved with its version."""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar, Generic, TypeVar

from django.db import connections, transaction

from pgmsg.core import conf, errors, payloads, sql
from pgmsg.events import names, reads
from pgmsg.events import store as events
from pgmsg.events.store import NO_STREAM, Event

A = TypeVar("A", bound="Aggregate")

#: Events read per query while loading.
LOAD_CHUNK = 1000

QUERIES = sql.load(__package__, "aggregates.sql")


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


class Aggregate:
    """Base of event-sourced aggregates, stored in stream ``<category>-<id>``.

    ::

        class Account(pgmsg.Aggregate, category="account"):
            def __init__(self, id):
                super().__init__(id)
                self.balance = Decimal(0)

            def deposit(self, amount):            # a command: check, then record
                self.record(Deposited(amount=amount))

            def apply_deposited(self, event):     # state change, no checks
                self.balance += event.amount

    ``apply(event)`` calls ``apply_<snake_case class name>``; override it to dispatch
    otherwise. ``record(event)`` applies a new event and keeps it in ``pending`` until the
    repository saves it. ``version`` is the stream version the state reflects.

    Snapshots (optional, see Repository): define ``snapshot_state()`` returning a JSON-able
    dict and ``restore_state(state)`` taking it back; raise ``snapshot_version`` whenever the
    state's shape changes, so that older snapshots are ignored.
    """

    category: ClassVar[str]
    snapshot_version: ClassVar[int] = 1

    def __init_subclass__(cls, *, category: str | None = None, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if category is not None:
            cls.category = names.validate_category(category)
        elif not hasattr(cls, "category"):
            raise errors.ConfigurationError(
                f"{cls.__qualname__}: give the stream category: "
                f"class {cls.__name__}(pgmsg.Aggregate, category='...')"
            )

    def __init__(self, id: str) -> None:
        self.id = str(id)
        self.version = 0
        self.pending: list[Event] = []
        names.validate_stream_name(self.stream_name)

    @property
    def stream_name(self) -> str:
        return f"{self.category}-{self.id}"

    def apply(self, event: Event) -> None:
        method = getattr(self, f"apply_{_snake(type(event).__name__)}", None)
        if method is None:
            raise errors.ConfigurationError(
                f"{type(self).__qualname__} has no method apply_{_snake(type(event).__name__)} "
                f"for events of type {event.pgmsg_type!r}"
            )
        method(event)

    def record(self, event: Event) -> None:
        """Apply a new event and keep it for the next save."""
        self.apply(event)
        self.pending.append(event)

    def snapshot_state(self) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__qualname__} does not define snapshot_state()")

    def restore_state(self, state: dict[str, Any]) -> None:
        raise NotImplementedError(f"{type(self).__qualname__} does not define restore_state()")


class Repository(Generic[A]):
    """Loads aggregates of one class from their streams and saves their new events.

    ``snapshot_every=N`` stores the aggregate's ``snapshot_state()`` whenever a save crosses a
    multiple of N versions (in the save's transaction), and ``load()`` starts from the latest
    snapshot of the class's current ``snapshot_version``, reading only the events after it.
    """

    def __init__(self, aggregate_class: type[A], *, snapshot_every: int | None = None) -> None:
        if snapshot_every is not None and (
            not isinstance(snapshot_every, int) or snapshot_every < 1
        ):
            raise errors.ConfigurationError(
                f"snapshot_every must be a positive int or None, got {snapshot_every!r}"
            )
        self.aggregate_class = aggregate_class
        self.snapshot_every = snapshot_every

    def load(self, id: str) -> A:
        """The aggregate with every stored event applied (version 0 if the stream is empty)."""
        aggregate = self.aggregate_class(id)
        if self.snapshot_every:
            self._restore(aggregate)
        while True:
            chunk = reads.read_stream(
                aggregate.stream_name, start=aggregate.version + 1, limit=LOAD_CHUNK
            )
            for recorded in chunk:
                aggregate.apply(recorded.event)
                aggregate.version = recorded.version
            if len(chunk) < LOAD_CHUNK:
                return aggregate

    def save(self, aggregate: A) -> int:
        """Append the pending events with the loaded version as expected version; raises
        ConcurrencyError (writing nothing) if someone else appended since the load."""
        if not aggregate.pending:
            return aggregate.version
        expected = aggregate.version or NO_STREAM
        db = conf.get().DATABASE
        with transaction.atomic(using=db):
            version = events.append(
                aggregate.stream_name, aggregate.pending, expected_version=expected
            )
            every = self.snapshot_every
            if every and version // every > aggregate.version // every:
                self._store(aggregate, version)
        aggregate.version = version
        aggregate.pending = []
        return version

    def _restore(self, aggregate: A) -> None:
        with connections[conf.get().DATABASE].cursor() as cursor:
            cursor.execute(
                QUERIES["load_snapshot"],
                {"stream": aggregate.stream_name, "schema": aggregate.snapshot_version},
            )
            row = cursor.fetchone()
        if row is not None:
            aggregate.restore_state(json.loads(row[1]))
            aggregate.version = row[0]

    def _store(self, aggregate: A, version: int) -> None:
        state = payloads.dumps(aggregate.snapshot_state())
        with connections[conf.get().DATABASE].cursor() as cursor:
            cursor.execute(
                QUERIES["store_snapshot"],
                {
                    "stream": aggregate.stream_name,
                    "version": version,
                    "schema": aggregate.snapshot_version,
                    "state": state,
                },
            )
