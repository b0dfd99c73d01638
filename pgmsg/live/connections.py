"""The live hub's own PostgreSQL connections: psycopg async, autocommit, named per process.

The hub opens two for its whole process (docs/live.md): one that LISTENs and holds the idle
declaration, one that reads the store. Both are named ``pgmsg live <pid>`` in
pg_stat_activity, so an operator (and the tests) can count them.
"""

from __future__ import annotations

import os

import psycopg
from django.db import connections

from pgmsg.core import conf, keepalive

#: pg_stat_activity.application_name of the hub's connections (the process id follows).
APPLICATION_NAME = "pgmsg live"


def application_name() -> str:
    return f"{APPLICATION_NAME} {os.getpid()}"


def connection_params() -> dict:
    """Django's connection parameters for the PGMSG database, as psycopg's connect() takes them,
    with keepalives (CONNECTION_DEAD_AFTER) so that a silent network partition ends the
    connection instead of leaving the hub deaf."""
    params = connections[conf.get().DATABASE].get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(key, None)
    return {**keepalive.client_options(), **params, "application_name": application_name()}


async def open_connection() -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(**connection_params(), autocommit=True)
