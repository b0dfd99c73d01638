"""The one batch runner every source uses, and the one rule for what a failure costs.

A source claims rows in a transaction, hands them to ``run_batch`` (handlers run inside that
same transaction), then acknowledges what was done and records what failed, still in that
transaction: handler writes and acknowledgements commit together or not at all.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import random
import time
import traceback
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, NamedTuple, TypeVar

import psycopg
from django.db import InterfaceError, connections, transaction

from pgmsg.core import conf, errors, instruments, throughput

logger = logging.getLogger("pgmsg.worker")

# A lost connection shows as InterfaceError: it must end the batch, not count as a failure.
CONNECTION_LOST = (InterfaceError, psycopg.InterfaceError)
_MAX_ERROR_CHARS = 4000

Row = TypeVar("Row")
T = TypeVar("T")


class Delivery(NamedTuple):
    """The message being handled, as seen from inside a listener (see current_delivery()).

    A named tuple, not a frozen dataclass: one is made per message, and a frozen dataclass
    costs about 2.5 us to build against 0.3 us (measured on this machine).
    """

    #: What kind of row: "notification", "inbox", "event", ...
    kind: str
    id: int | str
    #: The channel, inbox or subscription name.
    name: str
    #: Failed attempts before this one (0 on the first delivery).
    attempts: int


_current: contextvars.ContextVar[Delivery | None] = contextvars.ContextVar(
    "pgmsg_delivery", default=None
)


def current_delivery() -> Delivery | None:
    """The delivery whose handlers are running now, or None outside a handler.

    Useful as an idempotency key for side effects outside the database, or to tell a
    first delivery from a retry.
    """
    return _current.get()


class bound(Generic[T]):  # noqa: N801  (used as a function: ``with bound(var, value):``)
    """Set a context variable for the length of a block (what handlers may read).

    A class rather than a generator context manager: it is entered once or twice per message.
    """

    __slots__ = ("_token", "_value", "_var")

    def __init__(self, var: contextvars.ContextVar[T], value: T) -> None:
        self._var, self._value = var, value

    def __enter__(self) -> None:
        self._token = self._var.set(self._value)

    def __exit__(self, *exc_info: object) -> None:
        self._var.reset(self._token)


def delivering(delivery: Delivery):
    """Make ``delivery`` what current_delivery() returns while the block runs."""
    return bound(_current, delivery)


class Redo(Exception):
    """A handler failed on run_batch's fast path: roll the claim transaction back and claim
    again with a savepoint per row (the worker does both; a source only lets it through)."""


@dataclasses.dataclass
class BatchResult(Generic[Row]):
    """What became of a batch: rows handled (in order) and rows whose handlers raised."""

    done: list[Row] = dataclasses.field(default_factory=list)
    failed: list[tuple[Row, Exception]] = dataclasses.field(default_factory=list)


def run_batch(
    worker,
    rows: Sequence[Row],
    *,
    delivery: Callable[[Row], Delivery],
    handle: Callable[[Row], None],
    group: Callable[[Row], Hashable] | None = None,
) -> BatchResult[Row]:
    """Run ``handle(row)`` for each claimed row inside the caller's claim transaction.

    Fast path: no savepoint at all. If a handler raises, ``Redo`` is raised from that error:
    it leaves the caller's ``transaction.atomic`` block, which rolls the whole claim
    transaction back (every write of the batch so far, and the claim itself), and the worker
    calls the source again with ``worker.careful`` set, which runs the batch it claims then
    with a savepoint per row, so the failure is recorded and the other rows still commit.
    Savepoints cost a round trip each (two per batch even for one savepoint around the
    batch); paying them only for batches that saw a failure is what makes batching pay. The
    price: in such a batch, the handlers of the rows before the failing one run twice (their
    database writes are kept once). PGMSG["SAVEPOINT_PER_MESSAGE"] turns the fast path off.

    ``group(row)``, for ordered sources: after a failure, the later rows of the same group are
    not run (they are in neither list; the caller leaves them for later).
    Once ``worker.stopping``, the rows not yet run are in neither list either.
    """
    db = worker.database
    if not conf.get().SAVEPOINT_PER_MESSAGE and not getattr(worker, "careful", False):
        # The loop does no more per row than it must (at 50,000 messages a second, one
        # microsecond a row is 5 % of a drain's time): the rows done are the prefix it saw,
        # and a handler's time is kept as a bare float beside its Delivery.
        seen: list[Delivery] = []
        durations: list[float] = []
        clock, set_current, reset_current = time.perf_counter, _current.set, _current.reset
        try:
            for row in rows:
                if worker.stopping:
                    break
                current = delivery(row)
                seen.append(current)  # with a handler's error, the Redo ends the batch
                token = set_current(current)
                started = clock()
                try:
                    handle(row)
                finally:
                    reset_current(token)
                    durations.append(clock() - started)
        except CONNECTION_LOST:
            raise
        except Exception as exc:
            if _connection_broken(db):
                raise  # a lost connection ends the batch (the worker reconnects)
            # Withdraw the crash record while this transaction still holds its rows: once it
            # rolls back, another worker may claim them, and must not take a record left
            # behind by a batch that aborted for a crash.
            worker.withdraw_claim()
            raise Redo(f"a handler failed on the fast path: {exc}") from exc
        finally:
            instruments.handler_durations(seen, durations)
        _account(worker, seen, [])
        return BatchResult(done=list(rows[: len(seen)]))
    result = BatchResult()
    blocked: set[Hashable] = set()
    ran: list[Delivery] = []
    durations = []
    try:
        for row in rows:
            if worker.stopping:
                break
            if group is not None and group(row) in blocked:
                continue
            current = delivery(row)
            try:
                with delivering(current), transaction.atomic(using=db):
                    ran.append(current)
                    started = time.perf_counter()
                    try:
                        handle(row)
                    finally:
                        durations.append(time.perf_counter() - started)
            except CONNECTION_LOST:
                raise
            except Exception as exc:
                result.failed.append((row, exc))
                if group is not None:
                    blocked.add(group(row))
            else:
                result.done.append(row)
    finally:
        instruments.handler_durations(ran, durations)
    _account(
        worker, [delivery(row) for row in result.done], [delivery(row) for row, _ in result.failed]
    )
    return result


def _connection_broken(db: str) -> bool:
    """Whether the connection died under the handler (the server ended it, the network went):
    then the batch is over, not redone on a fresh connection that Django would open."""
    raw = connections[db].connection
    return raw is None or raw.closed or raw.broken


def _account(worker, done: list[Delivery], failed: list[Delivery]) -> None:
    """Count the batch in pgmsg_throughput and in the Prometheus counters once its
    transaction commits: through the running worker's tally (written about once a second),
    or, for a source driven without one, by a row written in the claim transaction."""
    db = worker.database
    handled_counts = Counter(map(instruments.source_of, done))
    failed_counts = Counter(map(instruments.source_of, failed))
    tally = getattr(worker, "tally", None)
    if tally is None:
        throughput.record(db, handled_counts, failed_counts)
    elif handled_counts or failed_counts:
        transaction.on_commit(lambda: tally.add(handled_counts, failed_counts), using=db)
    if handled_counts:
        transaction.on_commit(lambda: instruments.handled(handled_counts), using=db)


# -- the failure rule -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Failure:
    """What a failed attempt leaves behind: the error text, and whether to give up or retry."""

    error: str
    give_up: bool
    #: Seconds until the next attempt (0 when giving up).
    retry_in: float


def retry_delay(attempts_before: int) -> float:
    """Exponential backoff with +-20 % jitter so retries of a failed batch spread out."""
    settings = conf.get()
    base = min(settings.RETRY_BACKOFF * 2**attempts_before, settings.RETRY_BACKOFF_MAX)
    return base * random.uniform(0.8, 1.2)


def describe_error(exc: BaseException) -> str:
    """The stored text of a message's error: its traceback, with the exceptions it chains,
    but never pgmsg's Redo nor what that chains (another message's error, on the fast path)."""
    described = traceback.TracebackException.from_exception(exc)
    _cut_redo(described)
    text = "".join(described.format())
    if len(text) > _MAX_ERROR_CHARS:
        text = text[: _MAX_ERROR_CHARS // 4] + "\n...\n" + text[-3 * _MAX_ERROR_CHARS // 4 :]
    return text


def _cut_redo(described: traceback.TracebackException) -> None:
    seen = set()
    while described is not None and id(described) not in seen:
        seen.add(id(described))
        for link in ("__cause__", "__context__"):
            chained = getattr(described, link)
            if chained is not None and _is_redo(chained):
                setattr(described, link, None)
        described = described.__cause__ or described.__context__


_REDO_NAME = f"{Redo.__module__}.{Redo.__qualname__}"


def _is_redo(described: traceback.TracebackException) -> bool:
    # Python 3.13 deprecates exc_type (a warning, an error under the tests' settings) for
    # exc_type_str, the dotted name; 3.11 and 3.12 have only exc_type.
    name = getattr(described, "exc_type_str", None)
    if name is not None:
        return name == _REDO_NAME
    return described.exc_type is not None and issubclass(described.exc_type, Redo)


def failure(
    delivery: Delivery,
    exc: Exception,
    *,
    max_attempts: int | None,
    giving_up: str = "dead",
    where: str = "",
    quiet: bool = False,
) -> Failure:
    """Decide what the failed attempt ``delivery.attempts + 1`` costs, and log one line for it.

    A NotRetryable error gives up at once; any other gives up after ``max_attempts`` (default
    PGMSG MAX_ATTEMPTS). ``giving_up`` says in the log what giving up means for this source.
    ``quiet``: a retry's line at DEBUG (a failure streak already logged; a dead letter's line
    stays at ERROR).
    """
    text = describe_error(exc)
    if isinstance(exc, errors.NotRetryable):
        give_up, text = True, "not retried: this message cannot succeed on a retry\n" + text
    else:
        give_up = delivery.attempts + 1 >= (max_attempts or conf.get().MAX_ATTEMPTS)
    retry_in = 0.0 if give_up else retry_delay(delivery.attempts)
    # One line per failed attempt, in key=value form (the same fields are on the record as
    # ``extra`` for structured handlers); the attempt that gives up is the dead letter's line,
    # at ERROR. The error's repr keeps a multi-line message on the line.
    fields = {
        "kind": delivery.kind,
        "id": delivery.id,
        "source": delivery.name,
        "attempt": delivery.attempts + 1,
        "outcome": giving_up.replace(" ", "_") if give_up else "retry",
    }
    logger.log(
        logging.ERROR if give_up else (logging.DEBUG if quiet else logging.WARNING),
        "pgmsg %s: kind=%s id=%s source=%s attempt=%s outcome=%s%s%s error=%r",
        "dead letter" if give_up else "failure",
        *fields.values(),
        "" if give_up else f" retry_in={retry_in:.3f}s",
        f" at={where.strip()!r}" if where else "",
        f"{type(exc).__name__}: {exc}",
        extra={f"pgmsg_{key}": value for key, value in fields.items()},
    )
    transaction.on_commit(
        lambda: instruments.failed(delivery.kind, delivery.name, give_up=give_up),
        using=conf.get().DATABASE,
    )
    return Failure(text, give_up, retry_in)
