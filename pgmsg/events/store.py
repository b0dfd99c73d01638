"""The event store: typed events, append with optimistic concurrency, gap-free reads."""

from __future__ import annotations

import contextvars
import dataclasses
import datetime as dt
import enum
import logging
import uuid
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, NamedTuple, dataclass_transform

from django.conf import settings
from django.db import IntegrityError, connections, transaction
from django.utils import timezone

from pgmsg.core import asynchrony, batch, conf, errors, payload_types, payloads, schema, sql, wire
from pgmsg.core.ids import uuid7
from pgmsg.events.names import category_of, is_type_name, validate_stream_name

logger = logging.getLogger(__name__)

QUERIES = sql.load(__package__, "events.sql")

_ENVELOPE_FIELDS = frozenset(("message_id", "metadata"))


class Expect(enum.Enum):
    """Expected versions that are not a number."""

    #: Append whatever the stream's version.
    ANY = "any"
    #: The stream must have no events yet (the same as expected version 0).
    NO_STREAM = "no stream"

    def __repr__(self) -> str:
        return f"pgmsg.{self.name}"

    __str__ = __repr__


ANY = Expect.ANY
NO_STREAM = Expect.NO_STREAM


# -- typed events ------------------------------------------------------------------------------


@dataclass_transform(field_specifiers=(dataclasses.field,))
@dataclasses.dataclass
class Event:
    """Base of typed events. A subclass is a dataclass whose fields are the event's data.

    ::

        class Deposited(pgmsg.Event, type="account.deposited"):
            amount: Decimal

    ``type`` (default: the class name) is stored beside the JSON data and names the class when
    the event is read back, so keep it stable when the class moves or is renamed. Every
    instance has a ``message_id`` (a new time-ordered UUID, version 7, unless given: give the
    same id to make a retried append idempotent) and ``metadata`` (``correlation_id``,
    ``causation_id``, anything else JSON can hold); both are keyword-only and kept out of the
    data.
    """

    pgmsg_type: ClassVar[str]

    message_id: uuid.UUID = dataclasses.field(
        default_factory=uuid7, kw_only=True, compare=False, repr=False
    )
    metadata: dict[str, Any] = dataclasses.field(
        default_factory=dict, kw_only=True, compare=False, repr=False
    )

    def __init_subclass__(cls, *, type: str | None = None, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "__dataclass_fields__" not in cls.__dict__:
            dataclasses.dataclass(cls)
        name = type or cls.__name__
        if not is_type_name(name):
            raise errors.ConfigurationError(
                f"{cls.__qualname__}: invalid event type {name!r}: use letters, digits, '_' or "
                "'.', starting with a letter"
            )
        payload_types.check_supported(cls)
        known = event_types.get(name)
        if known is not None and _origin(known) != _origin(cls):
            raise errors.ConfigurationError(
                f"event type {name!r} is declared twice: by {_origin(known)} and {_origin(cls)}"
            )
        cls.pgmsg_type = name
        event_types[name] = cls

    def follows(self, cause: RecordedEvent) -> Event:
        """Mark this event as caused by ``cause`` (causation id; correlation id carried on)."""
        self.metadata["causation_id"] = str(cause.message_id)
        self.metadata["correlation_id"] = cause.metadata.get("correlation_id") or str(
            cause.message_id
        )
        return self


def _origin(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


#: Event classes by stored type name.
event_types: dict[str, type[Event]] = {}


def event_class(type_name: str) -> type[Event]:
    try:
        return event_types[type_name]
    except KeyError:
        raise errors.UnknownEventType(
            f"no Event class has type {type_name!r}; known types: {sorted(event_types)}"
        ) from None


def _data_of(event: Event, *, check: bool, what: str) -> str:
    """The event's data as JSON (its fields but the envelope's), checked to decode back into
    its class when ``check`` (a PayloadError naming ``what`` if not)."""
    return payloads.dumps_checked(type(event), event, what=what, skip=_ENVELOPE_FIELDS, check=check)


# -- checkpoints ---------------------------------------------------------------------------------


class Checkpoint(NamedTuple):
    """A place in the store's read order: everything at or before (transaction_id, position)."""

    transaction_id: int
    position: int


#: Before the first event.
START = Checkpoint(0, 0)

#: A message id stored already, as Django raises it (wire.send's errors are Django's).
_STORED_ID = IntegrityError


def as_checkpoint(value: Any) -> Checkpoint:
    """``value`` as a Checkpoint: None means START; a stored pair of ints is accepted."""
    if value is None:
        return START
    if (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        return Checkpoint(*value)
    raise errors.InvalidCheckpoint(
        f"not a checkpoint: {value!r}; pass None (or pgmsg.START) to read from the beginning, "
        "or a RecordedEvent's .checkpoint, a (transaction_id, position) pair of ints >= 0"
    )


@dataclasses.dataclass(eq=False)
class RecordedEvent:
    """An event as stored: where it is, when it was written, and its (lazily decoded) event."""

    position: int
    transaction_id: int
    stream_name: str
    version: int
    type: str
    data: dict[str, Any]
    metadata: dict[str, Any]
    message_id: uuid.UUID
    recorded_at: dt.datetime
    _event: Event | None = dataclasses.field(default=None, repr=False)

    @property
    def category(self) -> str:
        return category_of(self.stream_name)

    @property
    def checkpoint(self) -> Checkpoint:
        return Checkpoint(self.transaction_id, self.position)

    @property
    def event(self) -> Event:
        """The typed event (raises UnknownEventType or PayloadError if it cannot be built)."""
        if self._event is None:
            self._event = payloads.load(
                event_class(self.type),
                self.data,
                message_id=self.message_id,
                metadata=dict(self.metadata),
            )
        return self._event

    @classmethod
    def from_rows(cls, rows: Iterable[tuple]) -> list[RecordedEvent]:
        """RecordedEvents of rows selected as read_ordered selects them."""
        # The time comes as microseconds since the epoch: a tenth of the cost of parsing the
        # text form, paid once per event read. fromtimestamp(us / 1e6) is exact: the float's
        # error (under 0.12 us until the year 2242) is rounded away to the microsecond, and it
        # takes half the time of adding a timedelta to the epoch.
        naive = not settings.USE_TZ
        loads, at, utc = payloads.from_jsonb, dt.datetime.fromtimestamp, dt.UTC
        out = []
        for position, xid, stream, version, type_, data, metadata, message_id, us in rows:
            recorded_at = at(us / 1e6, utc)
            out.append(
                cls(
                    position,
                    int(xid),
                    stream,
                    version,
                    type_,
                    loads(data),
                    {} if metadata == "{}" else loads(metadata),
                    message_id,
                    timezone.make_naive(recorded_at) if naive else recorded_at,
                )
            )
        return out


# -- appending -----------------------------------------------------------------------------------

#: The event being handled by a subscription, so appends in a handler record their cause.
_cause: contextvars.ContextVar[RecordedEvent | None] = contextvars.ContextVar(
    "pgmsg_event_cause", default=None
)


def caused_by(recorded: RecordedEvent):
    """Within the block, events appended record ``recorded`` as their cause."""
    return batch.bound(_cause, recorded)


def call_caused_by(func: Callable[[RecordedEvent], Any], recorded: RecordedEvent) -> None:
    """``func(recorded)`` with ``recorded`` as the cause of events it appends: caused_by
    without a context manager, for the subscription's once-per-event path."""
    token = _cause.set(recorded)
    try:
        func(recorded)
    finally:
        _cause.reset(token)


def append(
    stream: str,
    events: Event | Iterable[Event],
    *,
    expected_version: int | Expect = ANY,
) -> int:
    """Append ``events`` to ``stream`` atomically, in the caller's transaction; return the
    stream's version after them.

    ``expected_version``: a version number, ``NO_STREAM`` (same as 0) or ``ANY``. A mismatch
    raises ConcurrencyError and writes nothing. Appends to one stream are serialised by a lock
    on its row, held until the caller's transaction ends. If every event's message id is
    stored already (a retried call), nothing is written and the stored version is returned,
    whatever ``expected_version``; if only some are, DuplicateMessageId is raised.
    """
    validate_stream_name(stream)
    given = [events] if isinstance(events, Event) else list(events)
    if not given:
        raise errors.PayloadError(f"append to {stream!r}: no events given")
    expected = _check_expected(expected_version)
    types, data, metadata, ids = _columns(stream, given)
    params = {
        "stream": stream,
        "category": category_of(stream),
        "types": types,
        "data": data,
        "metadata": metadata,
        "ids": ids,
    }
    db = conf.get().DATABASE
    connection = connections[db]
    version = _append_at_once(connection, db, params, expected)
    if version is not None:
        return version
    # A version mismatch or a stored message id: decide with the stream locked.
    return _append_locked(connection, db, params, expected, expected_version)


aappend = asynchrony.awaitable(append)


def _columns(stream: str, given: list[Event]) -> tuple[list, list, list, list]:
    """The events as the append statement's arrays: types, data, metadata, message ids (each
    event checked, and following the event being handled, if any)."""
    types, data, metadata, ids = [], [], [], []
    cause = _cause.get()
    validate = conf.get().VALIDATE_ON_SEND
    for event in given:
        if not isinstance(event, Event) or type(event) is Event:
            raise errors.PayloadError(
                f"append to {stream!r}: {event!r} is not an instance of a pgmsg.Event subclass"
            )
        if not isinstance(event.metadata, dict):
            raise errors.PayloadError(
                f"metadata of {event!r} must be a dict, got {event.metadata!r}"
            )
        if cause is not None and "causation_id" not in event.metadata:
            event.follows(cause)
        types.append(event.pgmsg_type)
        data.append(
            _data_of(
                event,
                check=validate,
                what=f"cannot append {event.pgmsg_type!r} to {stream!r}",
            )
        )
        metadata.append(payloads.dumps(event.metadata) if event.metadata else "{}")
        ids.append(_message_id(event))
    if len(set(ids)) != len(ids):
        raise errors.DuplicateMessageId(
            f"append to {stream!r}: a message id appears twice: "
            f"{sorted(str(i) for i in ids if ids.count(i) > 1)}"
        )
    return types, data, metadata, ids


def _append_at_once(connection, db: str, params: dict, expected: int | Expect) -> int | None:
    """The one statement, checking the expected version itself: the new version, or None on
    a version mismatch or a stored message id (nothing written)."""
    try:
        if connection.get_autocommit():
            # No transaction open: the one statement is atomic by itself, and a failed one
            # wrote nothing; BEGIN and COMMIT would only add two round trips.
            return _insert(connection, params, None if expected is ANY else expected)
        with transaction.atomic(using=db):
            return _insert(connection, params, None if expected is ANY else expected)
    except _STORED_ID:
        return None  # a stored message id: the statement (or its savepoint) wrote nothing
    except schema.ERRORS as exc:  # no query beforehand: the hot path is measured
        schema.translate(exc, db)
        raise


def _append_locked(
    connection, db: str, params: dict, expected: int | Expect, expected_version: int | Expect
) -> int:
    """The append again with the stream locked: a retried call's stored version, a
    ConcurrencyError, or the events written."""
    stream, ids = params["stream"], params["ids"]
    with transaction.atomic(using=db), connection.cursor() as cursor:
        cursor.execute(QUERIES["lock_stream"], {"stream": stream})
        current = cursor.fetchone()[0]
        cursor.execute(QUERIES["stored_messages"], {"ids": ids})
        stored = {row[0]: (row[1], row[2]) for row in cursor.fetchall()}
        if stored:
            return _already_stored(stream, ids, stored)
        if expected is not ANY and expected != current:
            raise errors.ConcurrencyError(stream, expected_version, current)
        try:
            with transaction.atomic(using=db):
                version = _insert(connection, params, current)
        except _STORED_ID:
            version = None
        if version is None:  # an id stored meanwhile by an append to another stream
            raise errors.DuplicateMessageId(
                f"append to {stream!r}: a message id was stored by another append meanwhile; "
                "nothing written"
            )
        return version


def _values(params: dict, encoding: str) -> list[str | bytes | None]:
    """The append statement's parameters as libpq takes them (the arrays binary)."""
    expected = params["expected"]
    return [
        params["stream"],
        params["category"],
        wire.text_array(params["types"], encoding),
        wire.text_array(params["data"], encoding),
        wire.text_array(params["metadata"], encoding),
        wire.uuid_array(params["ids"]),
        None if expected is None else str(expected),
    ]


#: append()'s statement, its parameters in _insert's order.
_APPEND = wire.Statement(
    QUERIES["append"],
    ["stream", "category", "types", "data", "metadata", "ids", "expected"],
    values=_values,
)


def _insert(connection, params: dict, expected: int | None) -> int | None:
    """Run the one-statement append on Django ``connection``; the new version, or None on a
    version mismatch (nothing written). A stored message id raises an IntegrityError.

    Through the wire layer's ladder (wire.send), as notify() is sent: where nobody watches
    Django's cursor, below it on Django's connection (same session, same transaction), the
    arrays as binary parameters: quoted into the text element by element they were a third of
    the Python time of a 100-event append, and psycopg's cursor and its array dumpers took
    about 60 us of a one-event append's 170 us of client CPU. Where someone watches it
    (an execute wrapper, query logging, SEND_THROUGH_DJANGO_CURSOR), through Django's
    cursor."""
    return wire.send(connection, _APPEND, {**params, "expected": expected})


def _check_expected(expected: Any) -> int | Expect:
    if expected is ANY:
        return ANY
    if expected is NO_STREAM:
        return 0
    if isinstance(expected, int) and not isinstance(expected, bool) and expected >= 0:
        return expected
    raise errors.PayloadError(
        f"expected_version must be a version number >= 0, pgmsg.NO_STREAM or pgmsg.ANY, "
        f"got {expected!r}"
    )


def _message_id(event: Event) -> uuid.UUID:
    value = event.message_id
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise errors.PayloadError(f"message_id of {event!r} is not a UUID: {value!r}") from None


def _already_stored(stream: str, ids: list[uuid.UUID], stored: dict) -> int:
    elsewhere = {str(i): s for i, (s, _) in stored.items() if s != stream}
    if elsewhere:
        raise errors.DuplicateMessageId(
            f"append to {stream!r}: message id(s) already stored in other streams: {elsewhere}"
        )
    if len(stored) != len(ids):
        missing = [str(i) for i in ids if i not in stored]
        raise errors.DuplicateMessageId(
            f"append to {stream!r}: some message ids are stored already and {missing} are not; "
            "a retried append must carry the same events as the first attempt"
        )
    logger.info("pgmsg: append to %r was stored already; nothing written", stream)
    return max(version for _, version in stored.values())
