"""libpq's calls, made below psycopg's cursor on a psycopg connection: send a statement (text,
prepared, or after a BEGIN in one round trip) and read its results with psycopg's own wait;
the parameters in the forms libpq takes (PostgreSQL's binary arrays among them)."""

from __future__ import annotations

import struct
import uuid

import psycopg
from psycopg import generators
from psycopg.pq import ExecStatus, PGresult, PipelineStatus, TransactionStatus
from psycopg.waiting import Wait

import pgmsg.core.wire.prepared as prepared

ROWS_OR_DONE = (ExecStatus.TUPLES_OK, ExecStatus.COMMAND_OK)
INTRANS, IDLE = TransactionStatus.INTRANS, TransactionStatus.IDLE
PIPELINE_OFF = PipelineStatus.OFF
WAIT_R = Wait.R
DIAG_SQLSTATE = psycopg.pq.DiagnosticField.SQLSTATE


def can_send(conn: psycopg.Connection) -> bool:
    """Whether a statement can go to libpq as it is: no BEGIN owed first (autocommit, or a
    transaction already under way), no pipeline."""
    status = conn.pgconn.transaction_status
    return conn.pgconn.pipeline_status == PIPELINE_OFF and (
        status == INTRANS or (conn.autocommit and status == IDLE)
    )


def one_value(
    conn: psycopg.Connection,
    statement: bytes,
    values: list[str | bytes | None],
    *,
    prepare: bool = False,
) -> int | None:
    """The integer (or NULL, or no row: None) that ``statement`` (parameters ``$1``..., see
    sql.numbered: text as str, binary as bytes, such as text_array's, None for NULL) returns,
    sent through libpq's extended protocol where can_send(conn) says so.

    A psycopg cursor's execute and fetch cost about 45 us of client CPU a call on this machine,
    and more when many producer processes share two cores (they ran at 0.59 of plain INSERT
    at 8 producers, this at 0.75; docs/decisions.md).

    ``prepare`` (prepared.prepares(db)): the statement is prepared on its first use on the
    connection and executed by name from then on: the server skips its parse and plan. Where
    the server session turns out to lack it, or to have it already (a pooler moved the
    connection), the call is made again after preparing anew if no transaction was under way
    (nothing ran); inside one, the transaction is aborted and the error says so
    (prepared.POOLER_HINT)."""
    params, formats = encoded(values, conn.info.encoding)
    if not prepare:
        results = run(
            conn, lambda pgconn: pgconn.send_query_params(statement, params, param_formats=formats)
        )
    else:
        outside = conn.pgconn.transaction_status == IDLE
        try:
            results = _run_prepared(conn, statement, params, formats)
        except prepared.LOST as lost:
            if isinstance(lost, psycopg.errors.DuplicatePreparedStatement):
                # The session has it (its name is its text's hash): run it by name.
                prepared.names_on(conn).add(prepared.name_of(statement))
            else:
                prepared.forget(conn)  # to be prepared anew
            if not outside:
                raise
            results = _run_prepared(conn, statement, params, formats)
    return value_of(results[-1])


def value_of(result: PGresult) -> int | None:
    """The integer in the first column of ``result``'s first row; None for NULL or no row."""
    value = result.get_value(0, 0) if result.ntuples else None
    return None if value is None else int(value)


def encoded(
    values: list[str | bytes | None], encoding: str
) -> tuple[list[bytes | None], list[int] | None]:
    """one_value's parameters as libpq takes them: text encoded, bytes as they are (binary),
    None as NULL; and their formats (None: all text)."""
    if bytes in map(type, values):
        params = [v if v is None or type(v) is bytes else v.encode(encoding) for v in values]
        return params, [1 if type(v) is bytes else 0 for v in values]
    return [None if v is None else v.encode(encoding) for v in values], None


def _run_prepared(
    conn, statement: bytes, params: list, formats: list[int] | None
) -> list[PGresult]:
    try:
        name = prepare_once(conn, statement)
        return run(
            conn, lambda pgconn: pgconn.send_query_prepared(name, params, param_formats=formats)
        )
    except prepared.LOST as e:
        if prepared.POOLER_HINT not in getattr(e, "__notes__", ()):
            e.add_note(prepared.POOLER_HINT)
        raise


def prepare_once(
    conn: psycopg.Connection, statement: bytes, param_types: list[int] | None = None
) -> bytes:
    """The name of ``statement`` prepared on ``conn``, preparing it there the first time (a
    prepared statement outlives a rolled-back transaction: the server keeps it until the
    session ends or it is deallocated). ``param_types``: the parameters' type oids, where the
    statement does not say them itself."""
    name = prepared.name_of(statement)
    names = prepared.names_on(conn)
    if name not in names:
        run(conn, lambda pgconn: pgconn.send_prepare(name, statement, param_types=param_types))
        names.add(name)
    return name


def run(conn: psycopg.Connection, send) -> list[PGresult]:
    """Send with ``send(pgconn)`` and wait for every result with psycopg's own wait (which
    cancels the statement on an interrupt, as a cursor's does); a failed statement raises
    psycopg's error for it."""
    with conn.lock:
        send(conn.pgconn)
        results = conn.wait(generators.execute(conn.pgconn))
    for result in results:
        if result.status not in ROWS_OR_DONE:
            raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
    return results


def run_after_begin(
    conn: psycopg.Connection, name: bytes, values: list[bytes | None]
) -> list[PGresult]:
    """BEGIN, then the prepared statement ``name`` with ``values``, in one round trip (libpq's
    pipeline mode); its results. A failed statement raises psycopg's error for it, once
    everything sent was read and the pipeline left (the transaction is then aborted: the
    atomic block rolls it back). A statement not there is forgotten, to be prepared anew."""
    with conn.lock:
        pgconn = conn.pgconn
        pgconn.enter_pipeline_mode()
        try:
            pgconn.send_query_params(b"BEGIN", None)
            pgconn.send_query_prepared(name, values)
            pgconn.pipeline_sync()
            results = conn.wait(_until_sync(pgconn))
        finally:
            pgconn.exit_pipeline_mode()
    for result in results:
        if result.status not in ROWS_OR_DONE:
            if result.error_field(DIAG_SQLSTATE) == b"26000":
                prepared.forget(conn)
            raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
    return results[1:]  # the first is BEGIN's


def _until_sync(pgconn):
    """A wait generator (psycopg's Connection.wait): send what is buffered, then every result
    up to the pipeline's sync."""
    yield from generators.send(pgconn)
    results = []
    while True:
        while pgconn.is_busy():
            yield WAIT_R
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            continue  # the end of one statement's results
        if result.status == ExecStatus.PIPELINE_SYNC:
            return results
        results.append(result)


# PostgreSQL's binary form of a one-dimensional array without NULLs (what array_recv reads):
# dimensions 1, no NULL flag, the element type, the length and lower bound 1, then each element
# as its length and its bytes. No dimensions at all for an empty array.
_ARRAY_HEADER = struct.Struct(">5i")
_EMPTY_ARRAY = struct.Struct(">3i")
_LENGTH = struct.Struct(">i")
_INT8_OID = psycopg.postgres.types["int8"].oid
_TEXT_OID = psycopg.postgres.types["text"].oid
_UUID_OID = psycopg.postgres.types["uuid"].oid
_UUID_LENGTH = _LENGTH.pack(16)


def text_array(items: list[str], encoding: str) -> bytes:
    """``items`` as a binary text[] parameter of one_value (``encoding``: the connection's)."""
    if not items:
        return _EMPTY_ARRAY.pack(0, 0, _TEXT_OID)
    parts = [_ARRAY_HEADER.pack(1, 0, _TEXT_OID, len(items), 1)]
    for item in items:
        data = item.encode(encoding)
        parts += _LENGTH.pack(len(data)), data
    return b"".join(parts)


def int8_array(items: list[int]) -> bytes:
    """``items`` as a binary int8[] parameter, packed in one call per part: psycopg's own list
    dumper looks at every element (for 1,000 ids, measured here: 4.5 ms as text, 1.3 ms in
    binary; this well under 0.1 ms)."""
    if not items:
        return _EMPTY_ARRAY.pack(0, 0, _INT8_OID)
    lengths_and_values = [8, 0] * len(items)  # each element: its length (8), its value
    lengths_and_values[1::2] = items
    head = _ARRAY_HEADER.pack(1, 0, _INT8_OID, len(items), 1)
    return head + struct.pack(f">{'iq' * len(items)}", *lengths_and_values)


def uuid_array(items: list[uuid.UUID]) -> bytes:
    """``items`` as a binary uuid[] parameter of one_value."""
    if not items:
        return _EMPTY_ARRAY.pack(0, 0, _UUID_OID)
    head = _ARRAY_HEADER.pack(1, 0, _UUID_OID, len(items), 1)
    return head + b"".join(_UUID_LENGTH + item.bytes for item in items)
