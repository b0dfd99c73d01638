"""Replication slots of logical outboxes: their names, and the WAL message publish() writes."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import re
import struct
from typing import Any

from django.db import connections, transaction

from pgmsg.core import errors, locks, sql

QUERIES = sql.load(__package__, "logical.sql")

#: SQLSTATE object_in_use: the slot is being read by another session right now.
SLOT_IN_USE = "55006"

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
        found = state(outbox, using=using)
        if found is not None and found.lost:
            raise lost_error(outbox, found)
        raise errors.ReplicationSlotMissing(
            f"outbox {outbox!r} captures with logical decoding and its replication slot "
            f"{slot_name(outbox, using=using)!r} does not exist yet, so nothing would read "
            "this message: start its relay once (manage.py listen), which creates the slot"
        )


@dataclasses.dataclass(frozen=True)
class SlotState:
    """What pg_replication_slots says about an outbox's slot."""

    outbox: str
    slot: str
    #: reserved, extended, unreserved (past max_slot_wal_keep_size: lost at the next
    #: checkpoint) or lost (invalidated: the WAL it needed is gone).
    wal_status: str | None
    #: The end of the last transaction the relay confirmed (text LSN).
    confirmed_flush_lsn: str | None
    #: Whether a session reads the slot at this instant (a relay's peek, health's look).
    active: bool
    #: Bytes of WAL from the confirmed position to the server's current one.
    lag_bytes: int | None
    max_slot_wal_keep_size: str
    #: PostgreSQL 17+: why it was invalidated, and since when no session used it.
    invalidation_reason: str | None = None
    inactive_since: str | None = None

    @property
    def lost(self) -> bool:
        return self.wal_status == "lost"


def state(outbox: str, *, using: str) -> SlotState | None:
    """The state of ``outbox``'s slot, or None when it has none."""
    slot = slot_name(outbox, using=using)
    with connections[using].cursor() as cursor:
        cursor.execute(QUERIES["slot_state"], {"slot": slot})
        found = cursor.fetchone()
    if found is None:
        return None
    row, keep_size, lag = found
    if isinstance(row, str):
        row = json.loads(row)
    return SlotState(
        outbox=outbox,
        slot=slot,
        wal_status=row.get("wal_status"),
        confirmed_flush_lsn=row.get("confirmed_flush_lsn"),
        active=bool(row.get("active")),
        lag_bytes=lag,
        max_slot_wal_keep_size=keep_size,
        invalidation_reason=row.get("invalidation_reason"),
        inactive_since=row.get("inactive_since"),
    )


def lost_error(outbox: str, found: SlotState) -> errors.ReplicationSlotLost:
    """The error of an invalidated slot: what happened, what may be lost, what to do."""
    why = f", reason {found.invalidation_reason}" if found.invalidation_reason else ""
    last = f"; no session has read it since {found.inactive_since}" if found.inactive_since else ""
    return errors.ReplicationSlotLost(
        f"outbox {outbox!r}: its replication slot {found.slot!r} was invalidated (wal_status = "
        f"'lost'{why}): PostgreSQL removed WAL the slot still needed, usually because it held "
        f"more than max_slot_wal_keep_size = {found.max_slot_wal_keep_size}{last}. Messages of "
        f"transactions committed after the slot's confirmed position {found.confirmed_flush_lsn} "
        "that the relay had not published are lost: in logical mode they were only in that WAL, "
        "so pgmsg cannot list them; find them in your own records. The relay stops and "
        "publish() to this outbox raises until you run "
        f"`manage.py pgmsg_outbox drop-slot {outbox} --yes`; the relay then creates a new slot "
        "when it starts"
    )


def lock_out_relays(cursor, outbox: str, found: SlotState) -> None:
    """Take ``outbox``'s relay lock for the rest of the transaction, so that no relay starts
    reading its slot meanwhile; raise ReplicationSlotInUse, naming it, when a relay holds it."""
    cursor.execute(QUERIES["lock_outbox"], {"outbox": outbox, "lock_space": locks.OUTBOX})
    if cursor.fetchone()[0]:
        return
    cursor.execute(QUERIES["relay_holder"], {"outbox": outbox, "lock_space": locks.OUTBOX})
    holder = cursor.fetchone()
    who = f" (backend pid {holder[0]}, client {holder[2] or 'local'})" if holder else ""
    raise errors.ReplicationSlotInUse(
        f"a relay holds outbox {outbox!r}{who}: stop its `manage.py listen` first, "
        f"then drop the slot {found.slot!r}"
    )


def drop_unless_relayed(outbox: str, *, using: str) -> SlotState:
    """Drop ``outbox``'s slot unless a relay holds the outbox or a session reads the slot;
    return the slot's state just before. The outbox's relay lock is held while dropping, so no
    relay can start reading meanwhile. Raises ReplicationSlotMissing or ReplicationSlotInUse."""
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        found = state(outbox, using=using)
        if found is None:
            raise errors.ReplicationSlotMissing(
                f"outbox {outbox!r} has no replication slot "
                f"({slot_name(outbox, using=using)!r}) in this database: nothing to drop"
            )
        lock_out_relays(cursor, outbox, found)
        cursor.execute(QUERIES["drop_slot"], {"slot": found.slot})
        if cursor.fetchone() is None:
            raise errors.ReplicationSlotInUse(
                f"a session is reading the slot {found.slot!r} of outbox {outbox!r} right now "
                "(health's look, or a peek by hand): try again"
            )
    return found


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
