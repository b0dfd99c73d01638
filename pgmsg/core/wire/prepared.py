"""pgmsg's own prepared statements: whether a database gets them (prepares), what a statement
is named (name_of), which names each connection has (names_on, forget), and where this process
stopped preparing after a server session lost one (stop). protocol.py prepares and runs
them."""

from __future__ import annotations

import functools
import hashlib
import logging
import weakref

import psycopg
from django.db.backends.base.base import BaseDatabaseWrapper

from pgmsg.core import conf

logger = logging.getLogger(__name__)

#: What a failed prepared statement's error says besides PostgreSQL's own message.
POOLER_HINT = (
    "pgmsg prepares its statements on each connection (PGMSG['PREPARE_STATEMENTS']); a "
    "statement missing from, or already in, the server session means a transaction-mode "
    "pooler moved this connection to another one: set PGMSG['PREPARE_STATEMENTS'] = False or "
    "DATABASES[...]['DISABLE_SERVER_SIDE_CURSORS'] = True, or let the pooler keep prepared "
    "statements (PgBouncer 1.21+: max_prepared_statements)"
)
#: A prepared statement the session does not have, and one it already has.
LOST = (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement)


def prepares(db: BaseDatabaseWrapper) -> bool:
    """Whether pgmsg prepares its hot statements on ``db``'s connections (protocol.one_value's
    ``prepare``): PGMSG["PREPARE_STATEMENTS"], and where that is None, unless ``db``'s settings
    say a transaction-mode pooler may sit in between, which may run the next transaction on a
    server session that lacks the statement (PgBouncer before 1.21 does): Django's
    DISABLE_SERVER_SIDE_CURSORS, which its docs ask for behind such a pooler, or OPTIONS that
    turn psycopg's prepared statements off themselves."""
    setting = conf.get().PREPARE_STATEMENTS
    if setting is not None:
        return setting
    settings = db.settings_dict
    if settings.get("DISABLE_SERVER_SIDE_CURSORS") or db.alias in _stopped:
        return False
    options = settings.get("OPTIONS") or {}
    return "prepare_threshold" not in options or options["prepare_threshold"] is not None


def stop(db: BaseDatabaseWrapper) -> None:
    """Prepare nothing more on ``db`` in this process, and say so, after a server session lost
    a statement inside a transaction (while PREPARE_STATEMENTS is None): something between
    this process and PostgreSQL (a transaction-mode pooler that loses them, a pool that resets
    sessions) would fail the next transactions the same way, so the error surfaces once."""
    if conf.get().PREPARE_STATEMENTS is None and db.alias not in _stopped:
        _stopped.add(db.alias)
        logger.warning(
            "pgmsg: a prepared statement was missing from (or already in) the server session "
            "of database %r; pgmsg stops preparing there in this process. %s",
            db.alias,
            POOLER_HINT,
        )


@functools.cache
def name_of(statement: bytes) -> bytes:
    """The name ``statement`` is prepared under: its text's hash, so the same on every
    connection and in every pgmsg process."""
    return b"pgmsg_" + hashlib.blake2b(statement, digest_size=8).hexdigest().encode()


def names_on(conn: psycopg.Connection) -> set[bytes]:
    """The names of the statements prepared on ``conn`` (a new connection has none)."""
    names = _names.get(conn)
    if names is None:
        names = _names[conn] = set()
    return names


def forget(conn: psycopg.Connection) -> None:
    """``conn``'s server session lost its statements: prepare them anew (the set is emptied
    in place, for the holders of it: sends keeps it)."""
    names = _names.get(conn)
    if names is not None:
        names.clear()


_names: weakref.WeakKeyDictionary[psycopg.Connection, set[bytes]] = weakref.WeakKeyDictionary()
#: Database aliases on which this process stopped preparing (stop).
_stopped: set[str] = set()
