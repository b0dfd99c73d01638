"""The worker's source for a subscription: one transaction per partition, checkpoint moved in it."""

from __future__ import annotations

import functools
import logging
from typing import Protocol

import psycopg
from django.db import DatabaseError, connections, transaction

from pgmsg.core import batch, claims, sources, wire
from pgmsg.core.sources import Worker
from pgmsg.events import partitions as store_partitions
from pgmsg.events import reads
from pgmsg.events import store as events
from pgmsg.events.partition_reads import (
    CRASH_ON_RECORD,
    EVENT_END,
    HORIZON_USED,
    read_parameters,
    read_query,
)
from pgmsg.events.store import Checkpoint, RecordedEvent
from pgmsg.events.subscriptions import (
    QUERIES,
    WAKE_PREFIX,
    Subscription,
    ensure_partitions,
)

logger = logging.getLogger(__name__)


class Archiving(Protocol):
    """A periodic archive timer (pgmsg.export.periodic.PeriodicArchive)."""

    def maybe_start(self) -> None: ...


#: pgmsg_claim.kind of events, named there by claims.number_keys(subscription, positions).
CLAIM_KIND = "event"

#: After a read that found nothing, the partition's checkpoint moves to the horizon only once
#: the horizon is this many transaction ids past it. Each move is a write, and holding the
#: partition gives every look a transaction id of its own, so the horizon is always one ahead:
#: a lingering worker wrote on every look (docs/decisions.md). Events of types the
#: subscription skips, in at most this many transactions, are read again by the next look.
IDLE_ADVANCE_XIDS = 1000


class SubscriptionSource:
    """One subscription (or a static share of its partitions), drained by the listen worker.

    Each partition is processed in its own transaction: lock the partition row (SKIP LOCKED:
    another worker holds it), read up to a batch of events after its checkpoint, run them
    through ``run_batch`` with the partition as the ordering group (the first failure stops
    the partition's batch), and move the checkpoint in the same transaction.
    """

    def __init__(
        self,
        sub: Subscription,
        share: tuple[int, int] | None = None,
        archive: Archiving | None = None,
    ) -> None:
        self.sub = sub
        self.label = f"subscription:{sub.name}"
        part, parts = share or (0, 1)
        if parts > 1:
            self.label += f" (share {part}/{parts})"
        self.mine = [p for p in range(sub.partitions) if p % parts == part]
        self._ready = False
        #: The partition's lock and read (read_partition) through the subscription's function.
        self._read_query = read_query(sub)
        # The last batch filled a partition's read: more is waiting, so the next batch skips
        # the look for idle partitions (two round trips) and goes to the partitions at once.
        self._busy = False
        # The horizon of the last round when every partition of it filled its read: none
        # reached it, so the next round may read below it again without asking the server
        # (a horizon stays valid; reading it looks at every session, about 1 ms).
        self._full_horizon: int | None = None
        self._maintenance = store_partitions.Maintenance()
        # Read floors (events/partitions.py): the months and their seals as last read, and each
        # partition's checkpoint as last seen. Either may be stale: the read statement checks
        # that the floor holds and the partition is read again without one when it does not.
        self._months: list[store_partitions.Range] | None = None
        self._seen: dict[int, int] = {}
        #: Periodic archive runs (PGMSG ARCHIVE_INTERVAL), started by the worker's first source:
        #: the app config hands worker_sources the export's timer (events does not import export).
        self.archive = archive
        #: Run for each event: the subscription's handlers, with the event as the cause of
        #: what they append (a partial: one Python frame less per event).
        self._handle_event = functools.partial(events.call_caused_by, sub.dispatch)
        # The event trigger wakes "events:<category>" with "events" as its scope, so a
        # subscription to every category declares itself idle for "events".
        category = sub.category
        self.wake_payloads = [WAKE_PREFIX if category is None else f"{WAKE_PREFIX}:{category}"]

    def wants(self, wake_payload: str) -> bool:
        if self.sub.category is None:
            return wake_payload == WAKE_PREFIX or wake_payload.startswith(WAKE_PREFIX + ":")
        return wake_payload in (WAKE_PREFIX, f"{WAKE_PREFIX}:{self.sub.category}")

    def seconds_until_due(self, worker: Worker) -> float | None:
        return sources.query_value(
            worker,
            QUERIES["seconds_until_due"],
            {"subscription": self.sub.name, "partitions": self.mine},
        )

    def process_batch(self, worker: Worker) -> int:
        db = worker.database
        # The event store's monthly partitions are made ahead by the worker's first
        # subscription source (docs/storage.md).
        if self is next(s for s in worker.sources if isinstance(s, SubscriptionSource)):
            if self._maintenance.maybe_run():
                self._months = None  # months made or sealed: read them again
            if self.archive is not None:
                self.archive.maybe_start()
        # One partition: its own read is the look (two round trips fewer after a wake-up).
        busy = self._busy or len(self.mine) == 1
        # One horizon for every partition of this round: read in an earlier statement than
        # each partition's read, so every transaction below it has ended by then. Straight to
        # the partitions, the first one reads it in its read's query string.
        xmin, due = self._full_horizon, self.mine
        # A cursor only when there is something to ask first (making one after a wake-up cost
        # 0.08 ms of the append-to-handler latency here).
        if not (self._ready and self._months is not None and busy):
            with connections[db].cursor() as cursor:
                if not self._ready:
                    with transaction.atomic(using=db):
                        ensure_partitions(self.sub, cursor)
                    self._ready = True
                if self._months is None:
                    self._months = store_partitions.ranges(cursor)
                if not busy:
                    xmin = xmin or reads.read_horizon(cursor)
                    due = self._due_or_advance(cursor, xmin)
        claimed, full = 0, 0
        for partition in due:
            if worker.stopping:
                break
            read, xmin = self._process_partition(worker, partition, xmin)
            claimed += read
            full += read >= worker.batch_size
        self._busy = full > 0
        # Only when all were full: a partition that reached the horizon must see a new one
        # next round, not wait for the others' backlog.
        self._full_horizon = xmin if due and full == len(self.mine) else None
        return claimed

    def _due_or_advance(self, cursor, xmin: int) -> list[int]:
        """The partitions worth a transaction each; none when nothing the subscription handles
        lies between their lowest checkpoint and the horizon (then the idle ones move there)."""
        cursor.execute(
            QUERIES["due_partitions"], {"subscription": self.sub.name, "partitions": self.mine}
        )
        rows = cursor.fetchall()
        if not rows:
            return []
        due = [row[0] for row in rows]
        self._seen.update((row[0], row[1]) for row in rows)
        lowest = min(Checkpoint(row[1], row[2]) for row in rows)
        # One cheap look for the whole subscription before a transaction per partition:
        # when nothing it handles lies between its lowest checkpoint and the horizon,
        # every partition may move to the horizon at once.
        # Archived events after a checkpoint: process it, to stop there (_stop_at_archive).
        if any(row[3] for row in rows) or reads.read_ordered(
            cursor,
            after=lowest,
            xmin=xmin,
            category=self.sub.category,
            types=self.sub.types,
            limit=1,
        ):
            return due
        cursor.execute(
            QUERIES["advance_idle"],
            {
                "subscription": self.sub.name,
                "partitions": due,
                "xid": xmin,
                "low_xid": lowest.transaction_id,
                "low_position": lowest.position,
            },
        )
        return []

    def _process_partition(
        self, worker: Worker, partition: int, xmin: int | None
    ) -> tuple[int, int | None]:
        """One partition's batch in its own transaction. Returns (events read, or the batch
        size to come back at once; the horizon the read stayed below: ``xmin``, or when that
        is None, the one read in the read's own round trip, None when nothing was read)."""
        db, sub = worker.database, self.sub
        connection = connections[db]
        # Inside a caller's transaction, a rollback is the caller's, not a dead worker's.
        own_transaction = not connection.in_atomic_block
        with transaction.atomic(using=db), wire.LazyCursor(connection) as cursor:
            seen = self._seen.get(partition)
            floor = None
            if seen is not None and self._months:
                floor = store_partitions.floor(self._months, seen)
            rows, xmin = self._lock_and_read(connection, partition, xmin, worker.batch_size, floor)
            if rows and not rows[0][6]:
                # The floor does not hold (a reset moved the checkpoint back, or a sealed month
                # changed): read every month, and the months again before the next floor.
                self._months = None
                rows, xmin = self._lock_and_read(
                    connection, partition, xmin, worker.batch_size, None
                )
            if not rows:
                return 0, xmin  # another worker holds it, or it is stopped or backing off
            id_, checkpoint_xid, checkpoint_position, attempts, xid, archived = rows[0][:6]
            start = Checkpoint(checkpoint_xid, checkpoint_position)
            self._seen[partition] = checkpoint_xid
            if archived is not None:
                self._stop_at_archive(cursor, id_, partition, start, archived)
                return 0, xmin
            found = [row[7:EVENT_END] for row in rows if row[7] is not None]
            record, keys = claims.NOT_SENT, []
            if found and own_transaction:
                # The claim record travels while the events are decoded (claims.send_record),
                # and while they run when no crash is on record: its answer is read then at
                # the block's end, after the commit (0.15 to 0.35 ms less after a wake-up).
                keys = claims.number_keys(sub.name, [row[0] for row in found])
                record = claims.send_record(worker, CLAIM_KIND, keys, xid)
            with record:
                read = run = RecordedEvent.from_rows(found)
                suspect = None
                if record.sent and rows[0][CRASH_ON_RECORD]:
                    run, suspect = self._record(worker, read, keys, record.crashes(), xid, attempts)
                handled, reached, closing = self._run(
                    worker, cursor, partition, rows[0], read, run, suspect, xmin
                )
                if not found and own_transaction:
                    closing.append((QUERIES["commit_without_flush"], {}))
                # The checkpoint's move and the COMMIT go in one round trip.
                wire.closing_commit(connection, closing)
        worker.handled += handled
        self._seen[partition] = reached.transaction_id  # committed: the next read's floor
        # A batch cut short at a suspect: come back at once for what follows it.
        return (worker.batch_size if run is not read else len(read)), xmin

    def _run(
        self,
        worker: Worker,
        cursor,
        partition: int,
        held: tuple,
        read: list[RecordedEvent],
        run: list[RecordedEvent],
        suspect: claims.Suspect | None,
        xmin: int,
    ) -> tuple[int, Checkpoint, list[tuple[str, dict]]]:
        """Run the events ``run`` of those ``read`` from the ``held`` partition (its row of the
        read), in the partition's transaction. Returns (events handled, the checkpoint they
        reached, the statements that record the outcome and go with the COMMIT)."""
        sub = self.sub
        id_, checkpoint_xid, checkpoint_position, attempts = held[:4]
        start = Checkpoint(checkpoint_xid, checkpoint_position)
        # Only the first event read is the one that failed before (if one did).
        first = read[0] if read else None
        complete = len(read) < worker.batch_size  # every event up to the horizon was read
        crashes = suspect.crashes if suspect else 0
        suspected = read[suspect.index] if suspect is not None else None

        def delivery(recorded: RecordedEvent) -> batch.Delivery:
            tries = attempts if recorded is first else 0
            if recorded is suspected:
                tries += crashes  # deaths alone count as attempts
            return batch.Delivery("event", recorded.position, sub.name, tries)

        verdict = suspect.verdict if suspect is not None else None
        if verdict is not None:  # it stops the partition without running again
            run = []
        result = batch.run_batch(
            worker,
            run,
            delivery=delivery,
            handle=self._handle_event,
            group=lambda _: partition,
        )
        handled = len(result.done)
        reached = result.done[-1].checkpoint if result.done else start
        if complete and run is read and not result.failed and handled == len(read):
            # Every matching event of ended transactions was read: the next read may
            # start at the horizon instead of re-scanning other partitions' events.
            if read or xmin - start.transaction_id >= IDLE_ADVANCE_XIDS:
                reached = max(reached, Checkpoint(xmin, 0))
        if verdict is not None:
            failed = (suspected, verdict)
        else:
            failed = self._first_failure(partition, result, delivery)
        closing = self._closing(id_, start, reached, handled, attempts, failed)
        if suspected is not None and (failed is not None or suspected in result.done):
            claims.forget(cursor, CLAIM_KIND, self._claim_key(suspected))
        return handled, reached, closing

    def _first_failure(self, partition: int, result, delivery):
        """The batch's failed event (the partition stops at it) with its recorded failure."""
        if not result.failed:
            return None
        recorded, exc = result.failed[0]
        return (
            recorded,
            batch.failure(
                delivery(recorded),
                exc,
                max_attempts=self.sub.max_attempts,
                giving_up="partition stopped",
                where=f" partition {partition} ({recorded.stream_name} v{recorded.version})",
            ),
        )

    @staticmethod
    def _closing(
        id_: int, start: Checkpoint, reached: Checkpoint, handled: int, attempts: int, failed
    ) -> list[tuple[str, dict]]:
        """The statement that records the partition's outcome (sent with the COMMIT): a
        failure, a move of the checkpoint, or none when nothing changed."""
        position = {"id": id_, "xid": reached.transaction_id, "position": reached.position}
        if failed is not None:
            recorded, failure = failed
            return [
                (
                    QUERIES["fail"],
                    {
                        **position,
                        "handled": handled,
                        "error": failure.error,
                        "failed_position": recorded.position,
                        "stop": failure.give_up,
                        "delay": failure.retry_in,
                    },
                )
            ]
        if reached != start or handled or attempts:
            return [(QUERIES["advance"], {**position, "handled": handled})]
        return []

    def _stop_at_archive(
        self, cursor, id_: int, partition: int, start: Checkpoint, archived: str
    ) -> None:
        """Events after the checkpoint were archived and dropped (pgmsg_archive --force):
        stop the partition with an error that says where they are, instead of passing over
        them unseen."""
        error = (
            f"events after this partition's checkpoint were archived: {archived}. Replay them "
            f"from there if the subscription needs them, then move past the archive with "
            f"`manage.py pgmsg_subscriptions reset {self.sub.name} --to archive`"
        )
        logger.error(
            "pgmsg: subscription %s partition %s stopped: %s", self.sub.name, partition, error
        )
        cursor.execute(
            QUERIES["fail"],
            {
                "id": id_,
                "xid": start.transaction_id,
                "position": start.position,
                "handled": 0,
                "error": error,
                "failed_position": None,
                "stop": True,
                "delay": 0,
            },
        )

    def _lock_and_read(
        self,
        connection,
        partition: int,
        xmin: int | None,
        limit: int,
        floor: store_partitions.Floor | None,
    ) -> tuple[list[tuple], int | None]:
        """Hold the partition and read its next events, in one statement (read_partition),
        from ``floor`` on (None: every month), below ``xmin`` (None: the read reads the
        horizon first). Returns (rows, horizon; None when the read was to read it and returned
        no row). No row: the partition is not ours to serve now. The partition's columns are
        those of the first row; the events are the rows with an event position."""
        # The read opens the partition's transaction (its BEGIN in the same round trip).
        params = read_parameters(self.sub, partition, xmin, limit, floor)
        try:
            # Prepared once per partition and floor on the worker's connection (a session of
            # its own, see opening_rows), the horizon its parameter (or NULL): the call's
            # parse and plan took about a third of a one-event read's server time.
            (rows,) = wire.opening_rows(
                connection, self._read_query, params, varying=("xmin",), prepare=True
            )
        except (DatabaseError, psycopg.Error) as exc:
            if psycopg.errors.UndefinedFunction in (type(exc), type(exc.__cause__)):
                # Made outside the migrations, the read function can be dropped under a
                # running worker: the worker reconnects, and its next round makes it again.
                self._ready = False
            raise
        if xmin is None and rows:
            xmin = rows[0][HORIZON_USED]
        return rows, xmin

    def _claim_key(self, recorded: RecordedEvent) -> int:
        return claims.number_keys(self.sub.name, [recorded.position])[0]

    def _record(
        self,
        worker: Worker,
        read: list[RecordedEvent],
        keys: list[int],
        crashes: dict[int, int],
        xid: int,
        attempts: int,
    ):
        """After the batch's claim was recorded outside its transaction with ``keys`` (one
        per event read; pgmsg/core/claims.py), and ``crashes`` came back: if some of its
        events were in batches that died, the batch is cut short (claims.guard): the events
        before the first such suspect run as usual; when the suspect comes first, it runs
        alone, or not at all when it died alone too often. ``attempts``: the partition's
        failed attempts on its first event.

        Returns (events to run, the suspect or None).
        """
        name, max_attempts = self.sub.name, self.sub.max_attempts
        claimed = [
            claims.Claimed(
                key,
                batch.Delivery("event", recorded.position, name, attempts if not i else 0),
                max_attempts,
            )
            for i, (key, recorded) in enumerate(zip(keys, read))
        ]
        guarded = claims.guard(worker, CLAIM_KIND, claimed, crashes, xid, before_suspect=True)
        if guarded.run == slice(None):
            return read, None  # (the caller tells a cut batch by identity)
        return read[guarded.run], guarded.suspect
