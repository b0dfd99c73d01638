"""notify(): send channel messages inside the caller's transaction."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg import generators
from psycopg.pq import ExecStatus, PipelineStatus, TransactionStatus

from pgmsg.channels import declarations as channels
from pgmsg.core import conf, errors, payloads, sql

QUERIES = sql.load(__package__, "notifications.sql")

#: QUERIES["send"] as libpq takes it (see _send_direct): notify()'s parameters in its order.
_SEND_STATEMENT = sql.numbered(QUERIES["send"], ["channel", "payload"])

# PostgreSQL refuses NOTIFY payloads of 8000 bytes or more ("payload string too long").
MAX_BROADCAST_BYTES = 7999


def notify(message: channels.Channel, *, using: str | None = None) -> int | None:
    """Send ``message`` on its channel, in the current transaction of database ``using``.

    Nothing is delivered if the transaction rolls back. Exactly-once channels store the message
    and return its id; broadcast channels NOTIFY it (at most 7999 bytes of JSON) and return None.
    """
    spec = channels.spec_of(message)
    settings = conf.get()
    text = _encode(spec, message, validate=settings.VALIDATE_ON_SEND)
    db = connections[using or settings.DATABASE]
    if spec.delivery == channels.BROADCAST:
        _check_broadcast_size(spec, text)
        with db.cursor() as cursor:
            cursor.execute(
                QUERIES["broadcast"],
                {"notify_channel": channels.BROADCAST_PREFIX + spec.name, "payload": text},
            )
        return None
    return _fetch_value(
        db,
        QUERIES["send"],
        {"channel": spec.name, "payload": text},
        settings,
        libpq_statement=_SEND_STATEMENT,
    )


def notify_many(messages: Iterable[channels.Channel], *, using: str | None = None) -> int:
    """Send many messages in one statement per delivery mode; returns how many were sent."""
    stored_channels, stored_payloads, broadcasts = [], [], []
    settings = conf.get()
    for message in messages:
        spec = channels.spec_of(message)
        text = _encode(spec, message, validate=settings.VALIDATE_ON_SEND)
        if spec.delivery == channels.BROADCAST:
            _check_broadcast_size(spec, text)
            broadcasts.append(
                {"notify_channel": channels.BROADCAST_PREFIX + spec.name, "payload": text}
            )
        else:
            stored_channels.append(spec.name)
            stored_payloads.append(text)
    db = connections[using or settings.DATABASE]
    if stored_channels:
        _fetch_value(
            db,
            QUERIES["send_many"],
            {"channels": stored_channels, "payloads": stored_payloads},
            settings,
        )
    if broadcasts:
        with db.cursor() as cursor:
            cursor.executemany(QUERIES["broadcast"], broadcasts)
    return len(stored_channels) + len(broadcasts)


def _fetch_value(
    db: BaseDatabaseWrapper,
    query: str,
    params: dict,
    settings: conf.Settings,
    *,
    libpq_statement: bytes | None = None,
):
    """Run one statement in ``db``'s current transaction and return its one value.

    Straight on psycopg's cursor of Django's connection (the same session and transaction:
    atomic blocks, savepoints and on_commit are Django's as ever), with the checks Django's
    cursor makes first. Django's cursor wrapper cost about as much client time as the insert
    itself (docs/wakeups.md), so it is used only where someone watches it: execute wrappers,
    query logging (DEBUG, assertNumQueries), or PGMSG["SEND_THROUGH_DJANGO_CURSOR"] (for
    instrumentation that patches Django's cursor class, such as some APM agents).
    """
    if settings.SEND_THROUGH_DJANGO_CURSOR or db.execute_wrappers or db.queries_logged:
        with db.cursor() as cursor:
            cursor.execute(query, params)
            return cursor.fetchone()[0]
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    db.validate_no_broken_transaction()
    with db.wrap_database_errors:
        conn = db.connection
        if libpq_statement is not None and _can_send_direct(conn):
            # ``libpq_statement``: ``query`` numbered (sql.numbered) in ``params``' order.
            return _send_direct(conn, libpq_statement, list(params.values()))
        cursor = _cursor_of(db)
        cursor.execute(query, params)
        return cursor.fetchone()[0]


def _can_send_direct(conn: psycopg.Connection) -> bool:
    """Whether a statement can go to libpq as it is: no BEGIN owed first (autocommit, or a
    transaction already under way), no pipeline, no prepared statements wanted."""
    status = conn.pgconn.transaction_status
    return (
        conn.prepare_threshold is None
        and conn.pgconn.pipeline_status == PipelineStatus.OFF
        and (
            status == TransactionStatus.INTRANS
            or (conn.autocommit and status == TransactionStatus.IDLE)
        )
    )


def _send_direct(conn: psycopg.Connection, statement: bytes, values: list[str]) -> int:
    """``statement`` (text parameters, one integer back) through libpq's extended protocol,
    waited for by psycopg's own wait (which cancels the statement on an interrupt, as a
    cursor's does).

    A psycopg cursor's execute and fetch cost about 45 us of client CPU a call on this machine,
    and more when many producer processes share two cores (they ran at 0.59 of plain INSERT
    at 8 producers, this at 0.75; docs/wakeups.md). What the cursor would do first is checked
    by _can_send_direct: psycopg would have sent nothing else before the statement."""
    encoding = conn.info.encoding
    with conn.lock:
        conn.pgconn.send_query_params(statement, [value.encode(encoding) for value in values])
        results = conn.wait(generators.execute(conn.pgconn))
    result = results[-1]
    if result.status != ExecStatus.TUPLES_OK:
        raise psycopg.errors.error_from_result(result, encoding=encoding)
    return int(result.get_value(0, 0))


def _cursor_of(db: BaseDatabaseWrapper):
    """A psycopg cursor of ``db``'s current connection, made once per connection: making one
    cost about as much client time as the rest of a send (measured here).

    Django turns psycopg's prepared statements off unless its OPTIONS set
    ``prepare_threshold`` (transaction-mode poolers before PgBouncer 1.21 lose them). Where
    they are on, the cursor binds on the server, so psycopg prepares pgmsg_send() like any
    statement (the server then skips its parse and plan); else it binds on the client, as
    Django's own cursor does."""
    cursor = db.__dict__.get("_pgmsg_cursor")
    conn = db.connection
    if cursor is None or cursor.connection is not conn or cursor.closed:
        cursor = psycopg.Cursor(conn) if conn.prepare_threshold is not None else conn.cursor()
        db.__dict__["_pgmsg_cursor"] = cursor
    return cursor


def _encode(spec: channels.ChannelSpec, message: channels.Channel, *, validate: bool) -> str:
    if validate:
        return payloads.dumps_checked(
            spec.payload_class, message, what=f"cannot send on channel {spec.name!r}"
        )
    return payloads.dumps(message)


def _check_broadcast_size(spec: channels.ChannelSpec, text: Any) -> None:
    size = len(text.encode())
    if size > MAX_BROADCAST_BYTES:
        raise errors.PayloadTooLarge(
            f"broadcast channel {spec.name!r}: payload is {size} bytes of JSON, PostgreSQL's "
            f"NOTIFY takes at most {MAX_BROADCAST_BYTES}; declare the channel with "
            "delivery='exactly_once' (the default) to send payloads of any size"
        )
