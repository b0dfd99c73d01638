"""The wire layer: statements sent below Django's cursor for speed, on Django's own connection
and in its transaction (docs/wire.md says what it copies from Django and psycopg, why, what
it costs to keep, and how to switch it off: PGMSG["SEND_THROUGH_DJANGO_CURSOR"]).

Producers (notify(), publish(), receive(), append()) call ``send(db, statement, params)``
with a ``Statement`` made once per query; it takes the first rung that applies of one
ladder: libpq on a connection kept from an earlier send -> libpq after the checks Django's
cursor makes -> Django's cursor, wherever someone watches it (sends.py). A worker's batch
transaction opens and closes with ``opening_rows`` and ``closing_commit`` (batches.py).

Modules: sends (the producers' ladder), batches (the worker's first and last round trips),
cursors (what is repeated of Django's cursor), protocol (libpq's calls, binary arrays),
prepared (pgmsg's prepared statements), binding (a batch's statement bound once).
"""

from __future__ import annotations

from pgmsg.core.wire.batches import closing_commit, opening_rows
from pgmsg.core.wire.cursors import LazyCursor
from pgmsg.core.wire.protocol import int8_array, prepare_once, text_array, uuid_array
from pgmsg.core.wire.sends import Statement, rows, send

__all__ = [
    "LazyCursor",
    "Statement",
    "closing_commit",
    "int8_array",
    "opening_rows",
    "prepare_once",
    "rows",
    "send",
    "text_array",
    "uuid_array",
]
