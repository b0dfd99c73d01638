"""The logical capture mode: messages travel in the WAL, and a replication slot feeds the relay.

publish() writes a transactional logical-decoding message (``pg_logical_emit_message``) in the
caller's transaction: no row, no index entry, no delete later. The relay reads the outbox's
replication slot through PostgreSQL's SQL interface (``pg_logical_slot_peek_binary_changes``
with pgoutput): whole transactions, in commit order, so one key's messages come in commit order
without a lock at publish time. It publishes them in waves like the table relay, then moves the
slot (``pg_replication_slot_advance``) to the end of the last transaction whose messages the
broker all confirmed: the earliest unconfirmed message stays ahead of the slot, and a relay
killed at any moment reads it again.

A message the broker refuses does not hold the slot back: it is written into the outbox table
(attempts 1, the broker's error), and so is every later message of its key while that key has a
row there; the table relay's claim then retries them in order, makes them dead letters, and
replay and discard work as in table mode. The slot moves past them once they are in the table.
A broker that cannot be reached holds the slot where it is.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import struct
import time
from collections import defaultdict

from django.db import DatabaseError, ProgrammingError, connections, transaction

from pgmsg.core import batch, errors, sql
from pgmsg.core.sources import Worker
from pgmsg.outbox import declarations, slots
from pgmsg.outbox.destinations.base import Envelope
from pgmsg.outbox.source import OutboxRelay

#: Peeks or advances tried while the slot is busy before the relay leaves it to its next round.
SLOT_BUSY_TRIES = 5

logger = logging.getLogger("pgmsg.outbox")

QUERIES = sql.load(__package__, "logical.sql")

#: The empty publication pgoutput is given (it yields the logical messages, no table change).
PUBLICATION = "pgmsg_outbox"

#: Bytes of WAL between the slot's restart and confirmed positions from which the relay asks
#: for a running-transactions record (advance_and_log_snapshot in logical.sql): decoding 1 MB
#: again costs a peek about 3 ms (measured: 3.7 MB, 11 to 15 ms per empty peek).
RESTART_GAP = 1 << 20


# -- decoding pgoutput ---------------------------------------------------------------------------


def decode(rows: list[tuple[str, bytes]], outbox: str) -> list[tuple[str, list[Envelope]]]:
    """pgoutput rows -> [(end LSN of the transaction, its messages of ``outbox``)], in commit
    order. Protocol version 1: B(egin), M(essage), C(ommit); nothing else is published."""
    wanted = slots.prefix(outbox).encode()
    transactions: list[tuple[str, list[Envelope]]] = []
    messages: list[Envelope] = []
    count = 0
    committed_at = slots.PG_EPOCH
    for lsn, data in rows:
        data = bytes(data)
        kind = data[:1]
        if kind == b"B":
            committed_at = slots.commit_time(data)
            messages = []
        elif kind == b"M":  # flags, LSN, prefix\0, length, content
            end = data.index(b"\0", 10)
            if data[10:end] != wanted:
                continue
            (length,) = struct.unpack_from(">i", data, end + 1)
            content = data[end + 5 : end + 5 + length].decode()
            count += 1
            messages.append(_envelope(-count, outbox, content, committed_at))
        elif kind == b"C":  # the row's LSN is the end of the commit record
            transactions.append((lsn, messages))
            messages = []
    return transactions


def _envelope(id_: int, outbox: str, content: str, committed_at: dt.datetime) -> Envelope:
    meta, payload = content.split("\n", 1)
    fields = json.loads(meta)
    return Envelope(
        id=id_,  # no row: -1, -2, ... in slot order within one peek
        outbox=outbox,
        message_id=fields["message_id"],
        destination=fields["destination"],
        topic=fields["topic"],
        type=fields["type"],
        key=fields["key"],
        payload=payload,
        headers=json.loads(fields["headers"]),
        attempts=0,
        created_at=committed_at,
    )


# -- the relay -----------------------------------------------------------------------------------


class LogicalRelay(OutboxRelay):
    """The relay of a logical outbox: its table lane first (refused, retried, parked and
    replayed messages, exactly as in table mode), then the slot."""

    def __init__(self, spec: declarations.Outbox, partition: tuple[int, int] | None = None):
        super().__init__(spec, partition)
        self.label += " (logical)"
        self._ready_on: object = None  # the DB connection that checked the server
        self.slot = ""  # its name, known once prepare() has run
        #: The WAL flush position before the last peek that found nothing (see _relay_slot).
        self._quiet_at: str | None = None
        #: pg_log_standby_snapshot() exists (PostgreSQL 16+) and this user may call it.
        self._can_log_snapshot = False
        #: The end of what was published but not confirmed yet, the slot being busy then.
        self._unconfirmed: str | None = None

    def process_batch(self, worker: Worker) -> int:
        self.maintain(worker)
        self._take_partitions(worker)
        if not self.held:
            return 0
        self.prepare(worker.database)
        from_table = super().process_batch(worker)
        if worker.stopping or self._waiting_for(self.outbox.destination):
            return from_table
        return from_table + self._relay_slot(worker)

    def prepare(self, using: str) -> None:
        """Check wal_level, and create the publication and the slot when missing (once per
        connection). Raises LogicalDecodingUnavailable when the server cannot decode."""
        connection = connections[using]
        connection.ensure_connection()
        if self._ready_on is connection.connection:
            return
        # A new session may have let go of the outbox meanwhile, and another relay moved the
        # slot on: advancing to an older position would fail. The slot's own position rules.
        self._unconfirmed = None
        slot = slots.slot_name(self.outbox.name, using=using)
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["server"], {"slot": slot, "publication": PUBLICATION})
            wal_level, has_slot, has_publication, slot_lost, can_log = cursor.fetchone()
            if wal_level != "logical":
                raise errors.LogicalDecodingUnavailable(
                    f"outbox {self.outbox.name!r} has capture='logical', which reads a "
                    f"replication slot and needs wal_level = logical; this server has "
                    f"wal_level = {wal_level}. Set wal_level = logical in postgresql.conf and "
                    "restart PostgreSQL, or declare the outbox with capture='table'"
                )
            if slot_lost:
                self._raise_if_lost(using)
            if not has_publication:
                try:
                    with transaction.atomic(using=using):
                        cursor.execute(QUERIES["create_publication"])
                except ProgrammingError:
                    pass  # another relay made it meanwhile
            if not has_slot:
                cursor.execute(QUERIES["create_slot"], {"slot": slot})
                logger.info("pgmsg outbox %r: created replication slot %r", self.outbox.name, slot)
        self.slot = slot
        self._can_log_snapshot = can_log
        self._ready_on = connection.connection

    def _raise_if_lost(self, using: str) -> None:
        """Stop on an invalidated slot: the messages it had not delivered are gone from the
        WAL, and a new slot would silently skip them, so an operator decides (drop-slot)."""
        found = slots.state(self.outbox.name, using=using)
        if found is None or not found.lost:
            return
        error = slots.lost_error(self.outbox.name, found)
        logger.error("pgmsg outbox %r: %s", self.outbox.name, error)
        raise error

    def _relay_slot(self, worker: Worker) -> int:
        db = worker.database
        # Published last round, the slot busy: confirm before peeking, or it is sent twice.
        if self._unconfirmed is not None and not self._confirm(db, self._unconfirmed):
            return 0
        with connections[db].cursor() as cursor:
            # Each peek decodes again from the slot's restart position: an idle relay's many
            # looks (the worker lingers before sleeping) skip it while no WAL was flushed.
            cursor.execute(QUERIES["flushed"])
            flushed = cursor.fetchone()[0]
            if flushed == self._quiet_at:
                return 0
            peek = {"slot": self.slot, "limit": worker.batch_size}
            if not self._on_slot(db, cursor, QUERIES["peek"], peek):
                return 0  # looked at again at the next round
            rows = cursor.fetchall()
        if not rows:
            self._quiet_at = flushed
            return 0
        transactions = decode(rows, self.outbox.name)
        envelopes = [e for _, messages in transactions for e in messages]
        blocked, unique, copies = self._held_back(db, envelopes)
        parked, sent, refused = self._settle_in_order(worker, unique, blocked)
        if parked or refused:
            self._park(db, parked, refused)
        settled = {e.id for e in [*parked, *sent, *copies]} | {e.id for e, _ in refused}
        # Acknowledge only the earliest: up to the last transaction with nothing unsettled
        # before it (every transaction peeked, when all went through).
        confirm = None
        for end_lsn, messages in transactions:
            if any(e.id not in settled for e in messages):
                break
            confirm = end_lsn
        confirmed = confirm is not None and self._confirm(db, confirm)
        worker.handled += len(sent)
        # The whole peek was confirmed: there may be more behind it. Something held the slot
        # back (a broker down, a stop, a busy slot): do not spin on it.
        return len(rows) if confirmed and confirm == transactions[-1][0] else 0

    def _confirm(self, db: str, lsn: str) -> bool:
        """Move the slot to ``lsn``. While another session keeps the slot busy, remember
        ``lsn``: the next round (a wake, or the sweep) confirms it before reading on."""
        advance = "advance_and_log_snapshot" if self._can_log_snapshot else "advance"
        with connections[db].cursor() as cursor:
            done = self._on_slot(
                db, cursor, QUERIES[advance], {"slot": self.slot, "lsn": lsn, "gap": RESTART_GAP}
            )
        self._unconfirmed = None if done else lsn
        return done

    def _on_slot(self, db: str, cursor, query: str, params: dict) -> bool:
        """Run a query that acquires the slot (a peek, an advance); False when another session
        kept the slot busy through every try: health's look at the oldest unrelayed message, a
        peek by hand. Busy is not an outage: raising would make the worker reconnect and let go
        of the outbox's partitions, and with them the lock that keeps drop-slot away."""
        for attempt in range(1, SLOT_BUSY_TRIES + 1):
            try:
                cursor.execute(query, params)
                return True
            except DatabaseError as exc:
                if getattr(exc.__cause__, "sqlstate", None) != slots.SLOT_IN_USE:
                    self._raise_if_lost(db)  # invalidated while the relay ran
                    raise
                if attempt < SLOT_BUSY_TRIES:
                    time.sleep(0.01 * attempt)
        return False

    def _held_back(self, db: str, envelopes: list[Envelope]):
        """(keys with rows in the outbox table, the envelopes to relay, the copies to skip).

        A copy is a message whose id is still unrelayed: in the outbox table, or earlier in this
        read (nothing of it is confirmed yet). Skipping it is table mode's rule (publish()
        writes no second row while the first is there); ids further apart in the slot are both
        published, with the same id (docs/outbox.md).
        """
        if not envelopes:
            return set(), [], []
        keys = sorted({e.key for e in envelopes if e.key is not None})
        ids = sorted({e.message_id for e in envelopes})
        with connections[db].cursor() as cursor:
            cursor.execute(
                QUERIES["in_table"], {"outbox": self.outbox.name, "keys": keys, "ids": ids}
            )
            found = cursor.fetchall()
        blocked = {key for key, _ in found if key is not None} & set(keys)
        seen = {message_id for _, message_id in found}
        unique, copies = [], []
        for e in envelopes:
            (copies if e.message_id in seen else unique).append(e)
            seen.add(e.message_id)
        if copies:
            logger.info(
                "pgmsg outbox %r: skipped %s message(s) whose id was still unrelayed: %s",
                self.outbox.name,
                len(copies),
                sorted({e.message_id for e in copies}),
            )
        return blocked, unique, copies

    def _settle_in_order(self, worker: Worker, envelopes: list[Envelope], blocked: set[str]):
        """Publish what can go now; return (to park behind a row of its key, sent, refused)."""
        sent, refused = self._publish(worker, [e for e in envelopes if e.key not in blocked])
        refused_keys = {e.key for e, _ in refused if e.key is not None}
        done = {e.id for e in sent} | {e.id for e, _ in refused}
        parked = [
            e for e in envelopes if e.id not in done and (e.key in blocked or e.key in refused_keys)
        ]
        return parked, sent, refused

    def _park(self, db: str, parked: list[Envelope], refused) -> None:
        failures: dict[int, batch.Failure] = {
            e.id: batch.failure(
                batch.Delivery("outbox message", e.message_id, e.outbox, 0),
                exc,
                max_attempts=self.outbox.max_attempts,
                where=f" to {e.destination!r}",
            )
            for e, exc in refused
        }
        rows = sorted([*parked, *(e for e, _ in refused)], key=lambda e: -e.id)
        columns: dict[str, list] = defaultdict(list)
        for e in rows:
            failed = failures.get(e.id)
            columns["message_ids"].append(e.message_id)
            columns["destinations"].append(e.destination)
            columns["topics"].append(e.topic)
            columns["types"].append(e.type)
            columns["keys"].append(e.key)
            columns["payloads"].append(e.payload)
            columns["headers"].append(json.dumps(e.headers))
            columns["attempts"].append(1 if failed else 0)
            columns["errors"].append(failed.error if failed else "")
            columns["dead"].append(bool(failed and failed.give_up))
            columns["delays"].append(failed.retry_in if failed else 0.0)
            columns["created"].append(e.created_at)
        with transaction.atomic(using=db), connections[db].cursor() as cursor:
            cursor.execute(QUERIES["park"], {"outbox": self.outbox.name, **columns})
