"""Statements sent through libpq below psycopg's cursor, on the same connection and in the same
transaction as Django's, where the cursor would cost a round trip or client time a hot path
cannot spare: producers' statements (core/sends.py: notify(), receive(), append()), and the
first statement of a worker's batch transaction.

Django's own cursor is used instead wherever someone watches it: execute wrappers, query
logging (DEBUG, assertNumQueries), or PGMSG["SEND_THROUGH_DJANGO_CURSOR"] (instrumentation that
patches Django's or psycopg's cursor classes, such as some APM agents).
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

import psycopg
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg import adapt, generators
from psycopg.pq import ExecStatus, PGresult, PipelineStatus, TransactionStatus
from psycopg.waiting import Wait

from pgmsg.core import binding, conf, prepared

ROWS_OR_DONE = (ExecStatus.TUPLES_OK, ExecStatus.COMMAND_OK)
INTRANS, IDLE = TransactionStatus.INTRANS, TransactionStatus.IDLE
PIPELINE_OFF = PipelineStatus.OFF
WAIT_R = Wait.R
DIAG_SQLSTATE = psycopg.pq.DiagnosticField.SQLSTATE


def watched(db: BaseDatabaseWrapper) -> bool:
    """Whether ``db``'s statements must go through Django's cursor (see the module's doc)."""
    return bool(conf.get().SEND_THROUGH_DJANGO_CURSOR or db.execute_wrappers or db.queries_logged)


def can_send(conn: psycopg.Connection) -> bool:
    """Whether a statement can go to libpq as it is: no BEGIN owed first (autocommit, or a
    transaction already under way), no pipeline."""
    status = conn.pgconn.transaction_status
    return conn.pgconn.pipeline_status == PipelineStatus.OFF and (
        status == TransactionStatus.INTRANS
        or (conn.autocommit and status == TransactionStatus.IDLE)
    )


def one_value(
    conn: psycopg.Connection,
    statement: bytes,
    values: list[str | bytes | None],
    *,
    prepare: bool = False,
) -> int | None:
    """The integer (or NULL: None) that ``statement`` (parameters ``$1``..., see sql.numbered:
    text as str, binary as bytes, such as text_array's, None for NULL) returns, sent through
    libpq's extended protocol where can_send(conn) says so.

    A psycopg cursor's execute and fetch cost about 45 us of client CPU a call on this machine,
    and more when many producer processes share two cores (they ran at 0.59 of plain INSERT
    at 8 producers, this at 0.75; docs/wakeups.md).

    ``prepare`` (prepared.prepares(db)): the statement is prepared on its first use on the
    connection and executed by name from then on: the server skips its parse and plan. Where
    the server session turns out to lack it, or to have it already (a pooler moved the
    connection), the call is made again after preparing anew if no transaction was under way
    (nothing ran); inside one, the transaction is aborted and the error says so
    (prepared.POOLER_HINT)."""
    params, formats = encoded(values, conn.info.encoding)
    if not prepare:
        results = _run(
            conn, lambda pgconn: pgconn.send_query_params(statement, params, param_formats=formats)
        )
    else:
        outside = conn.pgconn.transaction_status == TransactionStatus.IDLE
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
    value = results[-1].get_value(0, 0)
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
        return _run(
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
        _run(conn, lambda pgconn: pgconn.send_prepare(name, statement, param_types=param_types))
        names.add(name)
    return name


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


def kept_cursor(db: BaseDatabaseWrapper, key: str, make):
    """The cursor ``make(connection)`` made, kept in ``db`` under ``key`` until the
    connection changes."""
    cursor = db.__dict__.get(key)
    conn = db.connection
    if cursor is None or cursor.connection is not conn or cursor.closed:
        cursor = db.__dict__[key] = make(conn)
    return cursor


class LazyCursor:
    """Django's cursor of ``db``, made on its first use and closed at the end of the ``with``
    block: a batch's own statements (a checkpoint, rows put back) need it, its opening claim
    does not (opening_rows), and making one right after a wake-up cost about 0.08 ms of the
    commit-to-handler latency on the 2-core machine (0.005 ms when warm)."""

    def __init__(self, db: BaseDatabaseWrapper) -> None:
        self._db = db
        self._cursor = None

    def __getattr__(self, name: str):
        if self._cursor is None:
            self._cursor = self._db.cursor()
        return getattr(self._cursor, name)

    def __enter__(self) -> LazyCursor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._cursor is not None:
            self._cursor.__exit__(*exc_info)


def opening_rows(
    db: BaseDatabaseWrapper,
    query: str,
    params: dict[str, Any],
    *,
    varying: tuple[str, ...] | None = None,
    prepare: bool = False,
) -> list[list[tuple]]:
    """The rows of each statement of ``query`` (one or more, ``;``-separated), run on ``db``
    as the first statements of the atomic block ``db`` is in.

    psycopg sends the BEGIN that opens the block's transaction in a round trip of its own
    before the first statement (about 0.2 ms on this machine: a tenth of a 100-message batch,
    and part of every wake-up's latency). Here the BEGIN and ``query`` go as one query string,
    with the values bound on the client as Django's cursor binds them (by a client-binding
    cursor of the connection's kind, kept per connection: no Django cursor is made); psycopg
    finds the transaction under way and sends no BEGIN of its own. Where psycopg would not
    send a plain BEGIN first (a transaction already under way, isolation settings of its own,
    a connection whose cursors bind on the server, a pipeline), it is that cursor's own
    execute; where someone watches Django's cursor (watched), Django's cursor's execute.

    ``varying``: the names of the parameters that change from call to call, integers (or
    None); the statement is then bound once per connection and set of the other parameters'
    values, and each call only writes its integers in (see binding.bound_once).

    ``prepare`` (one statement, with ``varying``): the statement so bound, its varying
    integers (or NULLs) as parameters, is prepared on the connection and run by name after a
    BEGIN in the same round trip (libpq's pipeline mode): the server skips its parse and
    plan, which took about half of a one-row claim's round trip (0.45 -> 0.23 ms, 100 rows
    0.83 -> 0.70 ms, on the 2-core machine). Only for a worker's own connection, which holds session
    advisory locks and so is never behind a transaction-mode pooler (where a prepared
    statement may be missing on the next server connection), and for a statement whose plan
    does not hang on the varying values (the planner sees the same whether custom or
    generic)."""
    if watched(db):
        with db.cursor() as cursor:
            return _all_rows(cursor, query, params)
    db.ensure_connection()
    db.validate_thread_sharing()
    db.validate_no_broken_transaction()
    conn = db.connection
    raw_cursor = kept_cursor(db, "_pgmsg_client_cursor", lambda c: c.cursor())
    if (
        not isinstance(raw_cursor, psycopg.ClientCursor)
        or conn.autocommit
        or conn.pgconn.transaction_status != TransactionStatus.IDLE
        or conn.pgconn.pipeline_status != PipelineStatus.OFF
        or conn.isolation_level is not None
        or conn.read_only is not None
        or conn.deferrable is not None
    ):
        with db.wrap_database_errors:
            return _all_rows(raw_cursor, query, params)
    if varying is None:
        text = b"BEGIN;\n" + raw_cursor.mogrify(query, params).encode(conn.info.encoding)
    elif prepare and (
        statement := binding.with_placeholders(db, raw_cursor, query, params, varying)
    ):
        text, names = statement
        values = [None if params[n] is None else b"%d" % params[n] for n in names]
        with db.wrap_database_errors:
            try:
                results = _run_after_begin(conn, prepare_once(conn, text), values)
            except psycopg.errors.InvalidSqlStatementName:
                # Deallocated behind pgmsg's back (a DEALLOCATE ALL or DISCARD ALL on the
                # connection). Nothing but the BEGIN ran: roll back, prepare anew, once.
                _run(conn, lambda pgconn: pgconn.send_query(b"ROLLBACK"))
                results = _run_after_begin(conn, prepare_once(conn, text), values)
        return _loaded(raw_cursor, results)
    else:
        text = b"BEGIN;\n" + binding.bound_once(db, raw_cursor, query, params, varying)
    with db.wrap_database_errors:
        results = _run(conn, lambda pgconn: pgconn.send_query(text))
    return _loaded(raw_cursor, results[1:])  # the first is BEGIN's


def _loaded(raw_cursor, results: list[PGresult]) -> list[list[tuple]]:
    loader = adapt.Transformer.from_context(raw_cursor)
    found = []
    for result in results:
        if result.status == ExecStatus.TUPLES_OK:
            loader.set_pgresult(result)
            found.append(loader.load_rows(0, result.ntuples, tuple))
    return found


def _all_rows(cursor, query: str, params: dict[str, Any]) -> list[list[tuple]]:
    """The rows of each statement of ``query``, run by ``cursor``'s own execute."""
    cursor.execute(query, params)
    found = [cursor.fetchall()]
    while cursor.nextset():
        found.append(cursor.fetchall())
    return found


def _run_after_begin(
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


def _run(conn: psycopg.Connection, send) -> list[PGresult]:
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


def closing_commit(db: BaseDatabaseWrapper, statements: list[tuple[str, dict[str, Any]]]) -> None:
    """Run ``statements`` ((query, params) pairs, bound on the client as Django's cursor binds
    them) and COMMIT, as one query string: the last round trip of the outermost atomic block
    ``db`` is in. The block's own COMMIT then finds the transaction ended and sends nothing
    (psycopg's commit() does not when the connection is idle); its on_commit hooks run as
    usual. psycopg's pipeline mode sent the same in one round trip, then spent a second one on
    its closing sync.

    Where the block is nested in another, or the COMMIT cannot be ours (someone watches Django's
    cursor, a connection whose cursors bind on the server, ...), the statements run on a
    cursor and the block's exit commits as usual."""
    conn = db.connection
    raw_cursor = kept_cursor(db, "_pgmsg_client_cursor", lambda c: c.cursor())
    if (
        watched(db)
        or len(db.atomic_blocks) != 1
        or db.needs_rollback
        or not isinstance(raw_cursor, psycopg.ClientCursor)
        or conn.pgconn.transaction_status != TransactionStatus.INTRANS
        or conn.pgconn.pipeline_status != PipelineStatus.OFF
    ):
        with db.cursor() as cursor:
            for query, params in statements:
                cursor.execute(query, params)
        return
    encoding = conn.info.encoding
    text = b";\n".join(
        [*(raw_cursor.mogrify(query, params).encode(encoding) for query, params in statements)]
        + [b"COMMIT"]
    )
    with db.wrap_database_errors:
        _run(conn, lambda pgconn: pgconn.send_query(text))
