"""Producers' one statement on Django's connection, below Django's cursor: notify()'s and the
inbox's receive() (fetch_value), append()'s (send_value, kept_send). Same session and
transaction as Django's; core/libpq.py sends. Once send_value has sent on a connection, later
calls on it repeat only the checks that can change between calls (_hot_value)."""

from __future__ import annotations

from _thread import get_ident
from collections.abc import Callable

import psycopg
from django.conf import settings as django_settings
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg import generators

from pgmsg.core import conf, libpq, prepared

_ROWS_OR_DONE = libpq.ROWS_OR_DONE
_INTRANS, _IDLE, _PIPELINE_OFF = libpq.INTRANS, libpq.IDLE, libpq.PIPELINE_OFF


def send_value(
    db: BaseDatabaseWrapper,
    conn: psycopg.Connection,
    statement: bytes,
    values: list[str | bytes | None],
    *,
    prepared_statement: bytes | None = None,
) -> int | None:
    """one_value on ``db``'s connection ``conn``: ``prepared_statement`` (or ``statement``)
    prepared where prepared.prepares(db) says so, else ``statement`` as it is. Where a session
    turns out to lack a statement inside a transaction, the error goes on, and this process
    stops preparing on ``db`` (prepared.stop).

    The caller has made the full checks (fetch_value's); once a send has gone through, the
    connection is kept fit for the shorter path of later calls (_hot_value)."""
    prepares = prepared.prepares(db)
    if not prepares:
        value = libpq.one_value(conn, statement, values)
    else:
        try:
            value = libpq.one_value(conn, prepared_statement or statement, values, prepare=True)
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


def kept_send(
    db: BaseDatabaseWrapper,
    statement: bytes,
    values_for: Callable[[str], list[str | bytes | None]],
    *,
    prepared_statement: bytes | None = None,
):
    """send_value's shorter path (_hot_value) for ``statement`` (or ``prepared_statement``),
    its values made by ``values_for(the connection's encoding)``, on a connection that
    send_value has sent on before; NOT_SENT where there is none, or where the caller's full
    path must run."""
    hot = db.__dict__.get(_HOT)
    if hot is None:
        return NOT_SENT
    return _hot_value(db, hot, values_for(hot[3]), statement, prepared_statement)


def cursor_checks(db: BaseDatabaseWrapper) -> None:
    """The checks Django's cursor makes before a statement, for a send that goes below it: a
    health check due, the connection (made if needed), the owning thread, a broken atomic
    block."""
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    db.validate_no_broken_transaction()


def fetch_value(
    db: BaseDatabaseWrapper,
    query: str,
    params: dict,
    *,
    libpq_statement: bytes | None = None,
    prepared_statement: bytes | None = None,
):
    """Run one statement in ``db``'s current transaction and return its one value.

    Straight on psycopg's cursor of Django's connection, or through libpq (one_value) when
    ``libpq_statement`` is given (``query`` numbered by sql.numbered in ``params``'
    order): the same session and transaction, so atomic blocks, savepoints and on_commit are
    Django's as ever, with the checks Django's cursor makes first. Django's cursor wrapper
    cost about as much client time as the insert itself (docs/wakeups.md), so it is used only
    where someone watches it (watched).

    Once a connection has taken that libpq path, later calls on it take _hot_value's shorter
    one, which repeats only the checks whose answer can change between calls.
    """
    if libpq_statement is not None:
        value = kept_send(
            db,
            libpq_statement,
            lambda _encoding: list(params.values()),
            prepared_statement=prepared_statement,
        )
        if value is not NOT_SENT:
            return value
    if libpq.watched(db):
        with db.cursor() as cursor:
            cursor.execute(query, params)
            return cursor.fetchone()[0]
    cursor_checks(db)
    with db.wrap_database_errors:
        conn = db.connection
        if libpq_statement is not None and libpq.can_send(conn):
            values = list(params.values())
            return send_value(
                db, conn, libpq_statement, values, prepared_statement=prepared_statement
            )
        cursor = _cursor_of(db)
        cursor.execute(query, params)
        return cursor.fetchone()[0]


#: Where send_value kept, in a Django connection's __dict__, what its libpq path found on
#: that connection: (psycopg connection, pgmsg settings, the names of the statements prepared
#: on it or None where pgmsg does not prepare there, its encoding).
_HOT = "_pgmsg_hot"
#: What the shorter path returns where the full one must run.
NOT_SENT = object()


def _hot_value(
    db: BaseDatabaseWrapper,
    hot: tuple,
    values: list[str | bytes | None],
    statement: bytes,
    prepared_statement: bytes | None,
):
    """send_value's libpq path on a connection that has taken it before (``hot``), or
    NOT_SENT where anything fetch_value checks may have changed since: a connection closed or
    replaced, PGMSG overridden, someone watching Django's cursor (an execute wrapper,
    assertNumQueries, DEBUG), a health check due, a broken atomic block, a pipeline, a BEGIN
    owed, or the statement not yet prepared on the connection. The checks that hold for the
    connection's life are not repeated.

    It exists for the cost of the checks themselves: in a producer whose process sleeps on
    every round trip, each Python call runs from cold caches, and the full path's checks
    cost notify() some 20 us of client CPU a call where a warm loop measures 5 (docs/wakeups.md)."""
    conn, settings, names, encoding = hot
    if (
        conn is not db.connection
        or settings is not conf.get()
        or db.needs_rollback
        or db.execute_wrappers
        or db.force_debug_cursor
        or django_settings.DEBUG
        or (db.health_check_enabled and not db.health_check_done)
    ):
        return NOT_SENT
    if db.__dict__.get("_thread_ident") != get_ident():
        db.validate_thread_sharing()  # raises unless the connection is shared on purpose
    pgconn = conn.pgconn
    status = pgconn.transaction_status
    if pgconn.pipeline_status != _PIPELINE_OFF or not (
        status == _INTRANS or (status == _IDLE and conn.autocommit)
    ):
        return NOT_SENT
    if names is not None:
        name = prepared.name_of(prepared_statement or statement)
        if name not in names:
            return NOT_SENT  # the full path prepares it
    params, formats = libpq.encoded(values, encoding)
    try:
        with conn.lock:
            if names is None:
                pgconn.send_query_params(statement, params, param_formats=formats)
            else:
                pgconn.send_query_prepared(name, params, param_formats=formats)
            results = conn.wait(generators.execute(pgconn))
        for result in results:
            if result.status not in _ROWS_OR_DONE:
                raise psycopg.errors.error_from_result(result, encoding=encoding)
    except prepared.LOST as lost:
        # The session lost the statement: what one_value and send_value do (prepare anew
        # and send where nothing ran; else the transaction is aborted and this process stops
        # preparing on db).
        prepared.forget(conn)
        db.__dict__.pop(_HOT, None)
        if status == _IDLE:
            return NOT_SENT
        lost.add_note(prepared.POOLER_HINT)
        prepared.stop(db)
        with db.wrap_database_errors:
            raise
    except Exception:
        with db.wrap_database_errors:
            raise
    value = results[-1].get_value(0, 0)
    return None if value is None else int(value)


def _cursor_of(db: BaseDatabaseWrapper):
    """A psycopg cursor of ``db``'s current connection, made once per connection: making one
    cost about as much client time as the rest of a send (measured here).

    Django turns psycopg's prepared statements off unless its OPTIONS set
    ``prepare_threshold`` (transaction-mode poolers before PgBouncer 1.21 lose them). Where
    they are on, the cursor binds on the server, so psycopg prepares pgmsg_send() or
    pgmsg_receive() like any statement (the server then skips its parse and plan); else it
    binds on the client, as Django's own cursor does."""
    return libpq.kept_cursor(
        db,
        "_pgmsg_cursor",
        lambda c: psycopg.Cursor(c) if c.prepare_threshold is not None else c.cursor(),
    )
