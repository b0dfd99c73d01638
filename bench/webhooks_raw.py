"""The raw ceiling of bench/webhooks.py: a WSGI app that verifies nothing and INSERTs each POST
into a plain table with psycopg (autocommit, one connection per gunicorn worker), then 200.

    RAW_DATABASE_URL=postgres://... gunicorn bench.webhooks_raw
"""

from __future__ import annotations

import os

import psycopg

_connection: psycopg.Connection | None = None


def application(environ, start_response):
    global _connection
    if _connection is None:  # after gunicorn's fork: one per worker
        _connection = psycopg.connect(os.environ["RAW_DATABASE_URL"], autocommit=True)
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    _connection.execute(
        "INSERT INTO bench_raw_webhook (message_id, payload) VALUES (%s, %s) "
        "ON CONFLICT (message_id) DO NOTHING",
        [environ.get("HTTP_PGMSG_MESSAGE_ID", ""), body.decode()],
    )
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", "2")])
    return [b"{}"]
