"""Producers' one statement on Django's connection: notify()'s, publish()'s, receive()'s and
append()'s (send), on the same session and in the same transaction as Django's. The ladder,
first rung that applies:

1. the kept connection path (_kept_value): libpq on a connection that took rung 3 before,
   repeating only the checks whose answer can change between calls;
2. Django's cursor, where someone watches it (cursors.watched);
3. libpq in full (_full_value), after the checks Django's cursor makes (cursors.checks);
4. a psycopg cursor of Django's connection, where libpq cannot send as it is (a BEGIN owed
   first, a pipeline) or the statement has no libpq form; with django.db's errors.
"""

from __future__ import annotations

import re
from _thread import get_ident
from collections.abc import Callable, Sequence

import psycopg
from django.conf import settings as django_settings
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg import generators

import pgmsg.core.wire.cursors as cursors
import pgmsg.core.wire.prepared as prepared
import pgmsg.core.wire.protocol as protocol
from pgmsg.core import conf, schema, sql

_ROWS_OR_DONE = protocol.ROWS_OR_DONE
_INTRANS, _IDLE, _PIPELINE_OFF = protocol.INTRANS, protocol.IDLE, protocol.PIPELINE_OFF
#: A binary placeholder, ``%(name)b``: written ``%(name)s`` for Django's cursor.
_BINARY_PLACEHOLDER = re.compile(r"%\((\w+)\)b")

Values = Callable[[dict, str], list[str | bytes | None]]


class Statement:
    """One producer statement in the forms the ladder's rungs send: ``query`` (``%(name)s``
    placeholders, or ``%(name)b`` for binary parameters) for a psycopg cursor, the same with
    text placeholders for Django's cursor (a cursor that binds on the client takes no
    binary parameter), and, where ``names`` gives the parameters' order, libpq's text
    (sql.numbered) and ``prepared``'s, the statement prepared instead where pgmsg prepares.
    ``values(params, encoding)``: the parameters as libpq takes them (default: each of
    ``names`` as it is)."""

    __slots__ = ("binary", "django_query", "libpq", "names", "prepared", "query", "values")

    def __init__(
        self,
        query: str,
        names: Sequence[str] | None = None,
        *,
        prepared: str | None = None,
        values: Values | None = None,
    ) -> None:
        self.query = query
        self.django_query = _BINARY_PLACEHOLDER.sub(r"%(\1)s", query)
        self.binary = self.django_query != query
        self.names = None if names is None else tuple(names)
        self.libpq = None if names is None else sql.numbered(query, list(names))
        self.prepared = None if prepared is None else sql.numbered(prepared, list(names or ()))
        self.values = values or self._as_named

    def _as_named(self, params: dict, encoding: str) -> list[str | bytes | None]:
        return [params[name] for name in self.names]


def send(db: BaseDatabaseWrapper, statement: Statement, params: dict):
    """Run ``statement`` with ``params`` in ``db``'s current transaction and return the first
    column of its one row (None: NULL, or no row), by the first rung of the module's ladder
    that applies. Atomic blocks, savepoints and on_commit are Django's as ever; a database
    error is django.db's, as from Django's cursor; on a database without pgmsg's tables and
    functions, NotMigrated.

    Django's cursor wrapper cost about as much client time as the insert itself
    (docs/decisions.md), so it is used only where someone watches it."""
    try:
        if statement.libpq is not None:
            hot = db.__dict__.get(_HOT)
            if hot is not None:
                value = _kept_value(db, hot, statement, params)
                if value is not NOT_SENT:
                    return value
        if cursors.watched(db):
            with db.cursor() as cursor:
                cursor.execute(statement.django_query, params)
                return cursors.first_value(cursor)
        cursors.checks(db)
        with db.wrap_database_errors:
            conn = db.connection
            if statement.libpq is not None and protocol.can_send(conn):
                return _full_value(
                    db, conn, statement, statement.values(params, conn.info.encoding)
                )
            cursor = cursors.producer_cursor(db, binary=statement.binary)
            cursor.execute(statement.query, params)
            return cursors.first_value(cursor)
    except schema.ERRORS as exc:  # no query beforehand: producers' hot path is measured
        schema.translate(exc, db.alias)  # a database where migrate never ran: NotMigrated
        raise


def rows(db: BaseDatabaseWrapper, statement: Statement, params: dict) -> list[tuple]:
    """Every row ``statement`` returns with ``params`` in ``db``'s current transaction: through
    Django's cursor where someone watches it (cursors.watched), else on a psycopg cursor of
    Django's connection that binds on the server, so that binary parameters (``%(name)b``:
    receive_many()'s arrays) go as PostgreSQL's binary arrays instead of being quoted into the
    text on the client (Django's cursor quoted 600 elements a 100-message batch). Database
    errors are django.db's, as from Django's cursor."""
    if cursors.watched(db):
        with db.cursor() as cursor:
            cursor.execute(statement.django_query, params)
            return cursor.fetchall()
    cursors.checks(db)
    with db.wrap_database_errors:
        cursor = cursors.producer_cursor(db, binary=statement.binary)
        cursor.execute(statement.query, params)
        return cursor.fetchall()


def _full_value(
    db: BaseDatabaseWrapper,
    conn: psycopg.Connection,
    statement: Statement,
    values: list[str | bytes | None],
) -> int | None:
    """protocol.one_value on ``db``'s connection ``conn``: ``statement``'s prepared text (or
    its libpq text) prepared where prepared.prepares(db) says so, else its libpq text as it
    is. Where a session turns out to lack a statement inside a transaction, the error goes
    on, and this process stops preparing on ``db`` (prepared.stop).

    The caller has made the full checks (send's); once a send has gone through, the
    connection is kept fit for the shorter path of later calls (_kept_value)."""
    prepares = prepared.prepares(db)
    if not prepares:
        value = protocol.one_value(conn, statement.libpq, values)
    else:
        try:
            value = protocol.one_value(
                conn, statement.prepared or statement.libpq, values, prepare=True
            )
        except prepared.LOST:
            prepared.stop(db)
            db.__dict__.pop(_HOT, None)
            raise
    db.__dict__[_HOT] = (
        conn,
        conf.get(),
        prepared.names_on(conn) if prepares else None,
        conn.info.encoding,
    )
    return value


#: Where _full_value kept, in a Django connection's __dict__, what its libpq path found on
#: that connection: (psycopg connection, pgmsg settings, the names of the statements prepared
#: on it or None where pgmsg does not prepare there, its encoding).
_HOT = "_pgmsg_hot"
#: What the shorter path returns where the full one must run.
NOT_SENT = object()


def _kept_value(db: BaseDatabaseWrapper, hot: tuple, statement: Statement, params: dict):
    """_full_value's libpq path on a connection that has taken it before (``hot``), or
    NOT_SENT where anything send checks may have changed since: a connection closed or
    replaced, PGMSG overridden, someone watching Django's cursor (an execute wrapper,
    assertNumQueries, DEBUG), a health check due, a broken atomic block, a pipeline, a BEGIN
    owed, or the statement not yet prepared on the connection. The checks that hold for the
    connection's life are not repeated.

    It exists for the cost of the checks themselves: in a producer whose process sleeps on
    every round trip, each Python call runs from cold caches, and the full path's checks
    cost notify() some 20 us of client CPU a call where a warm loop measures 5
    (docs/decisions.md)."""
    conn, settings, names, encoding = hot
    if not _still_fit(db, conn, settings):
        return NOT_SENT
    if names is not None:
        name = prepared.name_of(statement.prepared or statement.libpq)
        if name not in names:
            return NOT_SENT  # the full path prepares it
    else:
        name = None
    status = conn.pgconn.transaction_status
    sent, formats = protocol.encoded(statement.values(params, encoding), encoding)
    try:
        results = _send_kept(conn, statement, name, sent, formats, encoding)
    except prepared.LOST as lost:
        return _lost_statement(db, conn, status, lost)
    except Exception:
        with db.wrap_database_errors:
            raise
    return protocol.value_of(results[-1])


def _still_fit(db: BaseDatabaseWrapper, conn: psycopg.Connection, settings: object) -> bool:
    """Whether nothing the full path checks has changed since ``db`` took it on ``conn``
    with ``settings``: see _kept_value."""
    if (
        conn is not db.connection
        or settings is not conf.get()
        or db.needs_rollback
        or db.execute_wrappers
        or db.force_debug_cursor
        or django_settings.DEBUG
        or (db.health_check_enabled and not db.health_check_done)
    ):
        return False
    if db.__dict__.get("_thread_ident") != get_ident():
        db.validate_thread_sharing()  # raises unless the connection is shared on purpose
    pgconn = conn.pgconn
    status = pgconn.transaction_status
    return pgconn.pipeline_status == _PIPELINE_OFF and (
        status == _INTRANS or (status == _IDLE and conn.autocommit)
    )


def _send_kept(
    conn: psycopg.Connection,
    statement: Statement,
    name: bytes | None,
    sent: list,
    formats: list,
    encoding: str,
) -> list:
    """One round trip of ``statement`` (by ``name`` where prepared): its results, or the
    server's error raised as psycopg's."""
    pgconn = conn.pgconn
    with conn.lock:
        if name is None:
            pgconn.send_query_params(statement.libpq, sent, param_formats=formats)
        else:
            pgconn.send_query_prepared(name, sent, param_formats=formats)
        results = conn.wait(generators.execute(pgconn))
    for result in results:
        if result.status not in _ROWS_OR_DONE:
            raise psycopg.errors.error_from_result(result, encoding=encoding)
    return results


def _lost_statement(db: BaseDatabaseWrapper, conn: psycopg.Connection, status, lost: Exception):
    """The session lost the prepared statement: what one_value and _full_value do (prepare
    anew and send where nothing ran, NOT_SENT; else the transaction is aborted and this
    process stops preparing on db, and the error goes on)."""
    prepared.forget(conn)
    db.__dict__.pop(_HOT, None)
    if status == _IDLE:
        return NOT_SENT
    lost.add_note(prepared.POOLER_HINT)
    prepared.stop(db)
    with db.wrap_database_errors:
        raise lost
