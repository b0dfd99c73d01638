"""Django's cursor, and what the layer repeats of it where it goes below: whether someone
watches it (watched: then it is used), the checks it makes before a statement (checks), the
psycopg cursors of Django's connection kept per connection (kept), and a Django cursor made
only if a batch needs one (LazyCursor)."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from django.db.backends.base.base import BaseDatabaseWrapper

from pgmsg.core import conf


def watched(db: BaseDatabaseWrapper) -> bool:
    """Whether ``db``'s statements must go through Django's cursor: an execute wrapper (APM
    agents, pgtrigger.ignore), query logging (DEBUG, assertNumQueries, CaptureQueriesContext,
    debug toolbars), or PGMSG["SEND_THROUGH_DJANGO_CURSOR"] (instrumentation that patches
    Django's or psycopg's cursor classes)."""
    return bool(conf.get().SEND_THROUGH_DJANGO_CURSOR or db.execute_wrappers or db.queries_logged)


def checks(db: BaseDatabaseWrapper) -> None:
    """The checks Django's cursor makes before a statement, for a send that goes below it: a
    health check due, the connection (made if needed), the owning thread, a broken atomic
    block."""
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    db.validate_no_broken_transaction()


def kept(db: BaseDatabaseWrapper, key: str, make: Callable[[psycopg.Connection], psycopg.Cursor]):
    """The cursor ``make(connection)`` made, kept in ``db`` under ``key`` until the
    connection changes."""
    cursor = db.__dict__.get(key)
    conn = db.connection
    if cursor is None or cursor.connection is not conn or cursor.closed:
        cursor = db.__dict__[key] = make(conn)
    return cursor


def client_cursor(db: BaseDatabaseWrapper):
    """A cursor of ``db``'s connection's own kind (Django's cursor_factory: one that binds on
    the client unless OPTIONS say server_side_binding), kept per connection."""
    return kept(db, "_pgmsg_client_cursor", lambda c: c.cursor())


def producer_cursor(db: BaseDatabaseWrapper, *, binary: bool):
    """A psycopg cursor of ``db``'s current connection for a producer's statement, made once
    per connection: making one cost about as much client time as the rest of a send
    (measured here).

    ``binary``: the statement has binary parameters (``%(name)b``), which only a cursor that
    binds on the server takes. Otherwise: Django turns psycopg's prepared statements off
    unless its OPTIONS set ``prepare_threshold`` (transaction-mode poolers before PgBouncer
    1.21 lose them). Where they are on, the cursor binds on the server, so psycopg prepares
    pgmsg_send() or pgmsg_receive() like any statement (the server then skips its parse and
    plan); else it binds on the client, as Django's own cursor does."""
    if binary:
        return kept(db, "_pgmsg_server_cursor", psycopg.Cursor)
    return kept(
        db,
        "_pgmsg_cursor",
        lambda c: psycopg.Cursor(c) if c.prepare_threshold is not None else c.cursor(),
    )


def first_value(cursor) -> object:
    """The first column of the first row the cursor's statement returned (None: no row)."""
    row = cursor.fetchone()
    return None if row is None else row[0]


class LazyCursor:
    """Django's cursor of ``db``, made on its first use and closed at the end of the ``with``
    block: a batch's own statements (a checkpoint, rows put back) need it, its opening claim
    does not (batches.opening_rows), and making one right after a wake-up cost about 0.08 ms
    of the commit-to-handler latency on the 2-core machine (0.005 ms when warm)."""

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
