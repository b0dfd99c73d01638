"""Crash accounting: which rows a batch ran, recorded outside the batch's transaction.

A handler that kills its process (a segfault in a C extension, the OOM killer, ``os._exit``)
takes its batch's transaction with it: the claims and any failure counts roll back, so the same
batch would be claimed, and crash, forever. So before a batch's handlers run, the worker
records the ids it claimed and the claiming transaction's id in ``pgmsg_claim``, through its
autocommit connection (one statement per batch, committed asynchronously: a worker process
that dies does not lose it; a server crash may, which only forgets a crash).

Each worker keeps one row for its records: a record replaces the worker's last one when that
batch committed (garbage then), and adds a row when it died, so the table holds about one row
per running worker plus the claims of batches that died (claims.sql says why it matters);
committed rows of stopped workers go with a worker's first record.

A claim whose transaction shows as *aborted* in ``pg_xact_status`` is a batch that died:
every id in it is a *suspect*. A crash is charged only to a row that ran alone: the claim
keeps whether its batch ran one row (``alone``, set by the record and by ``narrow``), and a
row's crashes are the claims of batches that died with it alone. The rows of a batch of
several that died are suspects without a charge: nobody knows yet which of them killed it,
and a worker killed from outside (the OOM killer, a deploy) kills innocents only. Recording a
batch returns its suspects with their crashes (one scan of this small table per batch, in the
statement that records it: no round trip more); a batch that holds suspects runs only its
first suspect, alone in its transaction (its record narrowed to it, in the same round trip as
before), and puts the others back, so the suspects are handled one per transaction and a
poison accumulates crashes in its runs alone only. Crashes count as attempts: at the source's
``max_attempts`` the suspect becomes a dead letter without running again ("worker process
died while handling it"); a poison that first died in a batch of several dies once more than
that. One guard does this for every source (``guard``, reading the rows' ``Claimed`` fields).
Outbox relays keep no claims: they run no handler, and a relay that dies rolls its batch back
with no attempt counted.

Rows are named in ``pgmsg_claim.ids`` by a bigint: their own id where it is one and unique to
the ``kind`` (notifications, plain inbox messages), or ``key(scope, value)``, a 64-bit hash of
a scope and a value, where it is not (a model inbox's primary keys, which may be text or UUIDs
and repeat across models), or ``number_keys(scope, values)``, the scope's hash plus an integer
value (an event's position, which each subscription handles apart). A collision (about 1 in
10^19 per pair; for number keys, two scopes whose hashes lie closer than the positions'
span) would only lend one row the other's crashes.

Any batch transaction that aborts counts: a killed process, a backend terminated by
``idle_in_transaction_session_timeout`` (a frozen worker), a lost connection or a server
restart. One such event makes its batch's rows suspects (charged a crash when it ran one row);
only repeated deaths of the same row alone make it dead.
"""

from __future__ import annotations

import hashlib
import logging
import os
import select
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import psycopg
from psycopg.adapt import Dumper

from pgmsg.core import batch, conf, sources, sql, wire

logger = logging.getLogger("pgmsg.worker")

QUERIES = sql.load(__package__, "claims.sql")

#: The error kept on a row made dead because its worker kept dying.
DIED = (
    "worker process died while handling it ({crashes} time(s)): its batch transaction "
    "rolled back each time (process killed, out of memory, segfault, or its session "
    "terminated); not run again. Fix the handler, then replay it."
)


def key(scope: str, value: object) -> int:
    """The claim id of ``value`` within ``scope`` (a model inbox): a signed 64-bit hash of
    both, stable across processes and releases."""
    digest = hashlib.blake2b(f"{scope}\x00{value}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def number_keys(scope: str, values: Iterable[int]) -> list[int]:
    """The claim ids of integer ``values`` within ``scope`` (a subscription's event
    positions): the scope's hash plus the value, wrapped to a signed 64-bit int. One hash per
    call instead of one per value (a catch-up names 1,000 events per batch). Two scopes
    collide only where their hashes lie as close as two positions (about 2^40 / 2^64)."""
    base = key(scope, "") + 2**63
    return [(base + value) % 2**64 - 2**63 for value in values]


class _Ids(list):
    """Claimed ids, sent as a binary int8[] by _IdsDumper."""


class _IdsDumper(Dumper):
    """A list of ints as PostgreSQL's binary int8[] (wire.int8_array), for psycopg's cursor."""

    format = psycopg.pq.Format.BINARY
    oid = psycopg.postgres.types["int8"].array_oid

    def dump(self, obj: list[int]) -> bytes:
        return wire.int8_array(obj)


# Registered on psycopg's default adapters: every connection made afterwards (the worker's
# side connection among them) finds it; a connection made before would use the list dumper.
psycopg.adapters.register_dumper(_Ids, _IdsDumper)


def record_and_count(
    worker: sources.Worker, kind: str, ids: Sequence[int], xid: int
) -> dict[int, int]:
    """Record, committed at once, that transaction ``xid`` is about to run rows ``ids``;
    return the crashes of those that have any: {id: crashes}."""
    with send_record(worker, kind, ids, xid) as record:
        return record.crashes()


#: record_and_count as libpq takes it: $1 kind, $2 ids (binary int8[]), $3 xid, $4 pid,
#: $5 the worker's row (NULL before its first record).
_RECORD_STATEMENT = sql.numbered(QUERIES["record_and_count"], ["kind", "ids", "xid", "pid", "row"])
_INT8 = psycopg.postgres.types["int8"].oid
_RECORD_TYPES = [psycopg.postgres.types["text"].oid, _IdsDumper.oid]
_RECORD_TYPES += [_INT8, psycopg.postgres.types["int4"].oid, _INT8]


def send_record(worker: sources.Worker, kind: str, ids: Sequence[int], xid: int) -> SentRecord:
    """record_and_count in two halves: the record is sent now, and travels, commits and is
    counted while the caller decodes its batch; ``.crashes()`` then reads the answer, which
    must come before any handler runs when a crash may be on record. When the batch's read
    found none (no claim of its kind whose batch died: none of its rows can be a suspect),
    the handlers may run while the record commits, and the answer is read at the end of the
    ``with`` block (after the batch's commit), or before the side connection's next use
    (settle). Use it as a context manager: at the block's end the answer is read, its error
    raised; when the block ends with an error of its own, the answer's is dropped.

    The statement goes through libpq's asynchronous calls on the worker's side connection:
    psycopg's own calls wait for the answer, and its pipeline mode waits for it as well before
    the implicit transaction's Sync, which the commit needs. The statement is in the socket
    when this returns: a worker process killed afterwards (its handler's doing) leaves it to
    the server, which runs and commits it (test_subscriptions_processes counts such deaths)."""
    settle(worker)
    conn = worker.side_connection()
    worker.last_claim = xid
    if conn is None:
        return SentRecord(None, worker)
    pgconn = conn.pgconn
    # Planned once per connection, as psycopg would prepare it.
    name = wire.prepare_once(conn, _RECORD_STATEMENT, param_types=_RECORD_TYPES)
    row = worker.claim_row
    params = [kind.encode(), wire.int8_array(list(ids)), b"%d" % xid, b"%d" % os.getpid()]
    params.append(None if row is None else b"%d" % row)
    pgconn.send_query_prepared(name, params, param_formats=[0, 1, 0, 0, 0])
    _flush(pgconn)
    record = worker.record_in_flight = SentRecord(conn, worker)
    return record


def settle(worker: sources.Worker) -> None:
    """Read the answer of the worker's record still on its way, if one is: before anything
    else is sent on the side connection (one statement at a time)."""
    if worker.record_in_flight is not None:
        worker.record_in_flight.crashes()


def _flush(pgconn: psycopg.pq.abc.PGconn) -> None:
    while pgconn.flush():  # 1: more to send than the socket took
        select.select([], [pgconn.socket], [])


class SentRecord:
    """A claim record on its way (send_record)."""

    def __init__(self, conn: psycopg.Connection | None, worker: sources.Worker | None) -> None:
        self._conn = conn
        self._worker = worker
        #: Whether a record went out (not without a side connection, or with nothing to record).
        self.sent = conn is not None

    def crashes(self) -> dict[int, int]:
        """Wait for the record's answer: the crashes of the recorded ids that have any."""
        conn, self._conn = self._conn, None
        if conn is None:
            return {}
        if self._worker.record_in_flight is self:
            self._worker.record_in_flight = None
        row, crashes = _answer(conn)
        self._worker.claim_row = row  # the next record replaces this one
        return crashes

    def __enter__(self) -> SentRecord:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        if self._conn is None:
            return
        if exc_type is None:
            self.crashes()
            return
        try:
            self.crashes()
        except psycopg.Error:
            pass  # the error on the way is the one that counts


#: No record sent: a batch with nothing to record, or run inside a caller's transaction.
NOT_SENT = SentRecord(None, None)


def _answer(conn: psycopg.Connection) -> tuple[int, dict[int, int]]:
    """The answer of the statement sent on ``conn`` by send_record, once it has ended (the
    record's row, the crashes of its ids that have any); its error raised as psycopg raises
    it. Notifications that arrive meanwhile (the side connection also LISTENs) are handed to
    psycopg, as its own calls do, for the worker's next wait."""
    pgconn = conn.pgconn
    results = []
    while True:
        pgconn.consume_input()  # raises OperationalError when the connection is lost
        while not pgconn.is_busy():
            result = pgconn.get_result()
            if result is None:
                _pass_on_notifications(pgconn)
                return _rows(conn, results)
            results.append(result)
        _pass_on_notifications(pgconn)
        select.select([pgconn.socket], [], [])


_SUCCESS = (psycopg.pq.ExecStatus.TUPLES_OK, psycopg.pq.ExecStatus.COMMAND_OK)


def _pass_on_notifications(pgconn: psycopg.pq.abc.PGconn) -> None:
    # libpq parses what consume_input() read in is_busy() and get_result(): only after those
    # does it list the notifications that came in with the answer.
    while (notify := pgconn.notifies()) is not None:
        if pgconn.notify_handler is not None:
            pgconn.notify_handler(notify)


def _rows(conn: psycopg.Connection, results: list) -> tuple[int, dict[int, int]]:
    for result in results:
        if result.status not in _SUCCESS:
            raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
    (result,) = results
    crashes = {
        int(result.get_value(i, 1)): int(result.get_value(i, 2))
        for i in range(result.ntuples)
        if result.get_value(i, 1) is not None
    }
    return int(result.get_value(0, 0)), crashes


def narrow(worker: sources.Worker, kind: str, ids: Sequence[int], xid: int) -> None:
    """The batch ``xid`` runs only ``ids`` of what it recorded (a suspect, alone)."""
    settle(worker)
    conn = worker.side_connection()
    if conn is not None:
        conn.execute(
            QUERIES["narrow"], {"kind": kind, "ids": _Ids(ids), "xid": xid, "pid": os.getpid()}
        )


def withdraw(worker: sources.Worker) -> None:
    """The worker rolled its last batch back on purpose (batch.Redo): not a crash."""
    settle(worker)
    conn = worker.side_connection()
    if conn is not None and worker.last_claim is not None:
        conn.execute(QUERIES["withdraw"], {"xid": worker.last_claim, "pid": os.getpid()})
    worker.last_claim = None


def forget(cursor, kind: str, row_id: int) -> None:
    """In the settling transaction: the suspect ``row_id`` no longer counts its crashes."""
    cursor.execute(QUERIES["forget"], {"kind": kind, "id": row_id})


def died_too_often(
    delivery: batch.Delivery, *, crashes: int, max_attempts: int | None
) -> batch.Failure | None:
    """For a suspect whose ``delivery.attempts`` include its ``crashes``: the dead-letter
    verdict once they reach ``max_attempts`` (default PGMSG MAX_ATTEMPTS), else None (then it
    runs alone in its batch)."""
    if delivery.attempts < (max_attempts or conf.get().MAX_ATTEMPTS):
        return None
    logger.error(
        "pgmsg: %s %s on %r: its worker died while handling it %s time(s); now dead",
        delivery.kind,
        delivery.id,
        delivery.name,
        crashes,
    )
    return batch.Failure(DIED.format(crashes=crashes), give_up=True, retry_in=0.0)


# -- the crash guard, one for every source ---------------------------------------------------


class Claimed(NamedTuple):
    """A claimed row as the crash guard reads it."""

    #: The row's id in ``pgmsg_claim.ids`` (its own id, key() or number_keys()).
    key: int
    #: The row's delivery: its ``attempts`` are the failed attempts before this run.
    delivery: batch.Delivery
    #: The row's source's max_attempts (None: PGMSG MAX_ATTEMPTS).
    max_attempts: int | None


class Suspect(NamedTuple):
    """The row of a batch that runs alone because a batch with it died before."""

    #: Its index among the rows given to guard().
    index: int
    #: Its crashes: deaths of its process while it ran alone (they count as attempts).
    crashes: int
    #: Its dead-letter verdict when those reached max_attempts (then nothing runs), else None.
    verdict: batch.Failure | None


class Guarded(NamedTuple):
    """What guard() lets run of a batch."""

    #: The rows that run: ``rows[run]``.
    run: slice
    #: The suspect that runs alone (or is dead), or None.
    suspect: Suspect | None


def guard(
    worker: sources.Worker,
    kind: str,
    rows: Sequence[Claimed],
    crashes: dict[int, int],
    xid: int,
    *,
    lead: Callable[[int], int] | None = None,
    before_suspect: bool = False,
) -> Guarded:
    """The crash guard of every source, once the batch's record answered ``crashes``
    ({key: crashes} of its suspects, send_record): a batch without suspects runs whole;
    otherwise its first suspect runs alone (its record narrowed to it, so that its death is
    charged to it alone), or runs no more once its crashes reach its max_attempts.

    ``lead(i)``: the index of the row that must run before row ``i`` (an ordered inbox's
    first message of the aggregate), which then runs alone in its stead.
    ``before_suspect``: the rows before the first suspect run as usual instead (a
    subscription's events, whose order the suspect must keep), the suspect in a later batch.
    """
    found = next((i for i, row in enumerate(rows) if row.key in crashes), None)
    if found is None:
        return Guarded(slice(None), None)
    if before_suspect and found:
        narrow(worker, kind, [row.key for row in rows[:found]], xid)
        return Guarded(slice(0, found), None)
    if lead is not None:
        found = lead(found)
    row = rows[found]
    count = crashes.get(row.key, 0)
    verdict = None
    if count:
        delivery = row.delivery._replace(attempts=row.delivery.attempts + count)
        verdict = died_too_often(delivery, crashes=count, max_attempts=row.max_attempts)
    narrow(worker, kind, [] if verdict else [row.key], xid)
    if verdict is not None:
        return Guarded(slice(0, 0), Suspect(found, count, verdict))
    return Guarded(slice(found, found + 1), Suspect(found, count, None))
