"""Event-sourced aggregates: state rebuilt from a stream, new events saved with its version."""

from __future__ import annotations

import re
from typing import ClassVar, Generic, TypeVar

from pgmsg import errors, events
from pgmsg.events import NO_STREAM, Event

A = TypeVar("A", bound="Aggregate")

#: Events read per query while loading.
LOAD_CHUNK = 1000


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
    """

    category: ClassVar[str]

    def __init_subclass__(cls, *, category: str | None = None, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if category is not None:
            cls.category = events.validate_category(category)
        elif not hasattr(cls, "category"):
            raise errors.ConfigurationError(
                f"{cls.__qualname__}: give the stream category: "
                f"class {cls.__name__}(pgmsg.Aggregate, category='...')"
            )

    def __init__(self, id: str) -> None:
        self.id = str(id)
        self.version = 0
        self.pending: list[Event] = []
        events.validate_stream_name(self.stream_name)

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


class Repository(Generic[A]):
    """Loads aggregates of one class from their streams and saves their new events."""

    def __init__(self, aggregate_class: type[A]) -> None:
        self.aggregate_class = aggregate_class

    def load(self, id: str) -> A:
        """The aggregate with every stored event applied (version 0 if the stream is empty)."""
        aggregate = self.aggregate_class(id)
        while True:
            chunk = events.read_stream(aggregate.stream_name, start=aggregate.version + 1,
                                       limit=LOAD_CHUNK)
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
        version = events.append(aggregate.stream_name, aggregate.pending,
                                expected_version=expected)
        aggregate.version = version
        aggregate.pending = []
        return version
