"""Replication slots of logical outboxes: their names, and the WAL message publish() writes."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import struct
from typing import Any

from django.db import connections

from pgmsg.core import errors, sql

QUERIES = sql.load(__package__, "logical.sql")

#: pgoutput's timestamps count microseconds from this epoch.
PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


def prefix(outbox: str) -> str:
    """The logical message prefix of an outbox's messages."""
    return "pgmsg.outbox:" + outbox


def slot_name(outbox: str, *, using: str) -> str:
    """The replication slot of ``outbox`` in the database of alias ``using``.

    Slot names are global to the server and allow only ``[a-z0-9_]``, at most 63 bytes: the
    outbox name, cleaned and cut, plus a hash of (database, outbox) so that two databases (a test
    database beside the development one) never share a slot.
    """
    database = connections[using].settings_dict["NAME"]
    digest = hashlib.sha256(f"{database}:{outbox}".encode()).hexdigest()[:8]
    return f"pgmsg_{re.sub('[^a-z0-9_]', '_', outbox)[:40]}_{digest}"


def emit(cursor: Any, outbox: str, row: dict[str, Any], *, using: str) -> None:
    """Write one message of a logical outbox into the current transaction's WAL."""
    meta = {k: row[k] for k in ("message_id", "destination", "topic", "type", "key", "headers")}
    cursor.execute(
        QUERIES["emit"],
        {
            "prefix": prefix(outbox),
            # One line of JSON for the rest, then the payload's own JSON text.
            "content": json.dumps(meta) + "\n" + row["payload"],
            "wake": "outbox:" + outbox,
            "slot": slot_name(outbox, using=using),
        },
    )
    if cursor.fetchone() is None:
        raise errors.ReplicationSlotMissing(
            f"outbox {outbox!r} captures with logical decoding and its replication slot "
            f"{slot_name(outbox, using=using)!r} does not exist yet, so nothing would read "
            "this message: start its relay once (manage.py listen), which creates the slot"
        )


def commit_time(begin: bytes) -> dt.datetime:
    """The commit time in a pgoutput BEGIN message (B, final LSN, commit time, xid)."""
    (micros,) = struct.unpack_from(">q", begin, 9)
    return PG_EPOCH + dt.timedelta(microseconds=micros)


def drop(outbox: str, *, using: str) -> bool:
    """Drop ``outbox``'s slot when no relay reads it now; True if it was dropped. The slot then
    keeps no WAL, and the messages it had not delivered are lost with it."""
    with connections[using].cursor() as cursor:
        cursor.execute(QUERIES["drop_slot"], {"slot": slot_name(outbox, using=using)})
        return cursor.fetchone() is not None
