"""Archive to the lake: old monthly partitions of the event store go to Parquet, are counted
there, and only then are dropped (manage.py pgmsg_archive; docs/storage.md).

Every step before the drop leaves the partition in place: a run that fails or is killed
midway is run again, and exports the partition again over the same path. The drop and the
record that says where the rows went commit together, after the Parquet count matched the
count taken under the partition's lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Iterator
from typing import Any

from django.db import connections, transaction
from django.utils import timezone
from psycopg import sql as pgsql

from pgmsg.core import conf, errors, locks, partitions, sql
from pgmsg.export import output, run, session, tables

logger = logging.getLogger(__name__)

QUERIES = sql.load(__package__, "archive.sql")

TABLE = "pgmsg_event"


@dataclasses.dataclass(frozen=True)
class Archived:
    partition: str
    path: str
    rows: int

    def describe(self) -> str:
        return f"{self.partition}: {self.rows} row(s) archived to {self.path} and dropped"


def due(before: dt.datetime) -> list[partitions.Partition]:
    """The event partitions whose whole range ends at or before ``before``, oldest first."""
    with connections[conf.get().DATABASE].cursor() as cursor:
        found = partitions.partitions(cursor, TABLE)
    return [p for p in found if not p.is_default and p.upper_time() <= before]  # type: ignore[operator]


def archive(
    before: dt.datetime,
    output_path: str,
    *,
    master: str | None = None,
    spark: Any = None,
    echo: Callable[[str], None] | None = None,
    force: bool = False,
) -> list[Archived]:
    """Archive every event partition that ends at or before ``before`` under ``output_path``
    (one Parquet dataset per partition, named after it). Raises ArchiveError at the first
    partition that cannot be archived; those archived before it stay archived.

    A partition holding events that a subscription has not passed yet (its checkpoint is
    before the partition's last event) is not archived: ArchiveError names the subscription.
    ``force`` archives it anyway; that subscription then stops at the archived range instead
    of passing over it (pgmsg/events/source.py, docs/storage.md)."""
    echo = echo or logger.info
    if timezone.is_naive(before):
        raise errors.ArchiveError(f"archive: --before needs a time zone, got {before!r}")
    if before > timezone.now():
        raise errors.ArchiveError(
            f"archive: --before {before.isoformat()} is in the future: only months that have "
            "ended are archived"
        )
    todo = due(before)
    if not todo:
        echo(f"nothing to archive: no event partition ends at or before {before.isoformat()}")
        return []
    with _exclusive():
        # Every partition's subscriptions are checked before Spark starts (and each again
        # before its drop): a refused run costs no Spark session.
        with connections[conf.get().DATABASE].cursor() as cursor:
            for partition in todo:
                _check_subscriptions(cursor, partition.name, force=force, echo=lambda _: None)
        master = master or conf.get().EXPORT_SPARK_MASTER
        if spark is None:
            session.check(master)
            spark = session.start_spark(master, name="pgmsg archive")
        return [
            _archive_one(p, output_path, spark=spark, echo=echo, force=force)
            for p in due(before)  # again: a run that just ended may have taken some
        ]


@contextlib.contextmanager
def _exclusive() -> Iterator[None]:
    """Hold the cluster's archive lock, or raise ArchiveRunning."""
    with connections[conf.get().DATABASE].cursor() as cursor:
        cursor.execute(QUERIES["try_lock"], {"lock_class": locks.ARCHIVE})
        if not cursor.fetchone()[0]:
            raise errors.ArchiveRunning(
                "archive: another pgmsg_archive run holds the archive lock; nothing was done"
            )
    try:
        yield
    finally:
        with connections[conf.get().DATABASE].cursor() as cursor:
            cursor.execute(QUERIES["unlock"], {"lock_class": locks.ARCHIVE})


def _archive_one(
    partition: partitions.Partition,
    output_path: str,
    *,
    spark: Any,
    echo: Callable[[str], None],
    force: bool,
) -> Archived:
    from pgmsg.models import Archive

    path = output.join(output_path, partition.name)
    database = conf.get().DATABASE
    with connections[database].cursor() as cursor:
        _check_subscriptions(cursor, partition.name, force=force, echo=echo)
    Archive.objects.using(database).update_or_create(
        partition=partition.name,
        defaults={
            "table": TABLE,
            "lower": partition.lower_time(),
            "upper": partition.upper_time(),
            "path": path,
            "status": Archive.Status.EXPORTING,
        },
    )
    echo(f"archiving {partition.name} [{partition.lower}, {partition.upper}) to {path}")
    # The partition is exported whole, as a snapshot (no watermark to follow).
    spec = tables.register(
        dataclasses.replace(
            tables.get("events"),
            name=partition.name,
            table=partition.name,
            transaction_column=None,
        )
    )
    try:
        run.export_tables(output_path, tables=[spec.name], spark=spark, full=True, echo=echo)
    finally:
        tables.unregister(spec.name)
    exported = spark.read.parquet(path).count()
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        cursor.execute(partitions.QUERIES["lock_timeout"])
        cursor.execute(_compose("lock_partition", partition.name))
        cursor.execute(_compose("partition_rows", partition.name))
        rows, first, last = cursor.fetchone()
        if rows != exported:
            raise errors.ArchiveError(
                f"archive: {partition.name} holds {rows} row(s) but {path} has {exported}: "
                "nothing was dropped; run pgmsg_archive again"
            )
        # Checked again under the lock: a subscription may have been reset meanwhile.
        end = _check_subscriptions(cursor, partition.name, force=force, echo=lambda _: None)
        cursor.execute(_compose("forget_keys", partition.name))
        partitions.drop(cursor, partition.name)
        cursor.execute(QUERIES["forget_dataset_watermark"], {"name": spec.name})
        Archive.objects.using(database).filter(partition=partition.name).update(
            status=Archive.Status.ARCHIVED,
            rows=rows,
            first_position=first,
            last_position=last,
            end_transaction_id=end[0] if end else None,
            end_position=end[1] if end else None,
            archived_at=timezone.now(),
        )
    done = Archived(partition.name, path, rows)
    echo(done.describe())
    return done


def _check_subscriptions(
    cursor, name: str, *, force: bool, echo: Callable[[str], None]
) -> tuple[int, int] | None:
    """Refuse (ArchiveError) to archive partition ``name`` while a subscription has not passed
    its last event, unless ``force``; returns that event's (transaction id, position), None
    for an empty partition."""
    cursor.execute(_compose("partition_end", name))
    end = cursor.fetchone()
    if end is None:
        return None
    cursor.execute(QUERIES["subscriptions_behind"], {"xid": end[0], "position": end[1]})
    behind = cursor.fetchall()
    if not behind:
        return end
    names = ", ".join(f"{sub!r} ({count} partition(s) behind)" for sub, count in behind)
    if not force:
        raise errors.ArchiveError(
            f"archive: {name} holds events up to position {end[1]} that subscription(s) "
            f"{names} have not handled yet: nothing was archived from it. Let them catch up "
            "(or reset or remove them), or give --force: they then stop at the archived range "
            "(docs/storage.md)"
        )
    echo(
        f"--force: archiving {name} although subscription(s) {names} have not passed it; "
        "they stop at the archived range"
    )
    return end


def _compose(statement: str, partition: str) -> pgsql.Composed:
    return pgsql.SQL(QUERIES[statement]).format(partition=partitions.identifier(partition))
