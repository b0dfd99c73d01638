"""notify(): send channel messages inside the caller's transaction."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from pgmsg.channels import declarations as channels
from pgmsg.core import conf, errors, libpq, payloads, sql

QUERIES = sql.load(__package__, "notifications.sql")

#: QUERIES["send"] as libpq takes it (libpq.one_value): notify()'s parameters in its order.
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
        )
    if broadcasts:
        with db.cursor() as cursor:
            cursor.executemany(QUERIES["broadcast"], broadcasts)
    return len(stored_channels) + len(broadcasts)


def _fetch_value(
    db: BaseDatabaseWrapper,
    query: str,
    params: dict,
    *,
    libpq_statement: bytes | None = None,
):
    """Run one statement in ``db``'s current transaction and return its one value.

    Straight on psycopg's cursor of Django's connection, or through libpq (core/libpq.py)
    when ``libpq_statement`` is given (``query`` numbered by sql.numbered in ``params``'
    order): the same session and transaction, so atomic blocks, savepoints and on_commit are
    Django's as ever, with the checks Django's cursor makes first. Django's cursor wrapper
    cost about as much client time as the insert itself (docs/wakeups.md), so it is used only
    where someone watches it (libpq.watched).
    """
    if libpq.watched(db):
        with db.cursor() as cursor:
            cursor.execute(query, params)
            return cursor.fetchone()[0]
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    db.validate_no_broken_transaction()
    with db.wrap_database_errors:
        conn = db.connection
        if libpq_statement is not None and libpq.can_send(conn):
            return libpq.one_value(conn, libpq_statement, list(params.values()))
        cursor = _cursor_of(db)
        cursor.execute(query, params)
        return cursor.fetchone()[0]


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
