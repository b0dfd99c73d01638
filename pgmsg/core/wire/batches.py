"""A worker's batch transaction on Django's connection, its first and last round trips below
Django's cursor: the first statement goes with the BEGIN (opening_rows), the last ones with
the COMMIT (closing_commit). Where someone watches Django's cursor (cursors.watched), or
psycopg would not send a plain BEGIN or COMMIT itself, the statements go through a cursor.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg import adapt
from psycopg.pq import ExecStatus, PGresult

import pgmsg.core.wire.binding as binding
import pgmsg.core.wire.cursors as cursors
import pgmsg.core.wire.protocol as protocol


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
    execute; where someone watches Django's cursor (cursors.watched), Django's cursor's execute.

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
    if cursors.watched(db):
        with db.cursor() as cursor:
            return _all_rows(cursor, query, params)
    db.ensure_connection()
    db.validate_thread_sharing()
    db.validate_no_broken_transaction()
    conn = db.connection
    raw_cursor = cursors.client_cursor(db)
    if (
        not isinstance(raw_cursor, psycopg.ClientCursor)
        or conn.autocommit
        or conn.pgconn.transaction_status != protocol.IDLE
        or conn.pgconn.pipeline_status != protocol.PIPELINE_OFF
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
                results = protocol.run_after_begin(conn, protocol.prepare_once(conn, text), values)
            except psycopg.errors.InvalidSqlStatementName:
                # Deallocated behind pgmsg's back (a DEALLOCATE ALL or DISCARD ALL on the
                # connection). Nothing but the BEGIN ran: roll back, prepare anew, once.
                protocol.run(conn, lambda pgconn: pgconn.send_query(b"ROLLBACK"))
                results = protocol.run_after_begin(conn, protocol.prepare_once(conn, text), values)
        return _loaded(raw_cursor, results)
    else:
        text = b"BEGIN;\n" + binding.bound_once(db, raw_cursor, query, params, varying)
    with db.wrap_database_errors:
        results = protocol.run(conn, lambda pgconn: pgconn.send_query(text))
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
    raw_cursor = cursors.client_cursor(db)
    if (
        cursors.watched(db)
        or len(db.atomic_blocks) != 1
        or db.needs_rollback
        or not isinstance(raw_cursor, psycopg.ClientCursor)
        or conn.pgconn.transaction_status != protocol.INTRANS
        or conn.pgconn.pipeline_status != protocol.PIPELINE_OFF
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
        protocol.run(conn, lambda pgconn: pgconn.send_query(text))
