"""Watermarks (how far each dataset has been exported) and the one-export-at-a-time lock."""

from __future__ import annotations

import logging

from django.db import DatabaseError, connections, transaction
from django.db.models.functions import Now

from pgmsg.core import conf, errors, locks, sql
from pgmsg.models import ExportWatermark

logger = logging.getLogger(__name__)

QUERIES = sql.load(__package__, "export.sql")
#: The advisory lock every batch export takes; a follow export takes one per checkpoint dir.
BATCH_LOCK = locks.EXPORT_BATCH


def watermark(name: str, *, using: str | None = None) -> int | None:
    """The transaction-id watermark of dataset ``name`` (None before its first export)."""
    row = ExportWatermark.objects.using(using or conf.get().DATABASE).filter(name=name).first()
    return row.transaction_xmin if row else None


def save(name: str, xmin: int | None, rows: int, *, using: str) -> None:
    """Record that dataset ``name`` holds every row below ``xmin`` (after its files are written)."""
    with transaction.atomic(using=using):
        row, _ = ExportWatermark.objects.using(using).select_for_update().get_or_create(name=name)
        row.transaction_xmin = xmin
        row.last_rows = rows
        row.total_rows += rows
        row.exported_at = Now()
        row.save(using=using)


class locked:
    """A session advisory lock, so two exports never read the same range twice."""

    def __init__(self, using: str, name: str = BATCH_LOCK, *, holder: str = "pgmsg export") -> None:
        self.using = using
        self.name = name
        self.holder = holder

    def __enter__(self) -> None:
        try:
            with connections[self.using].cursor() as cursor:
                cursor.execute(QUERIES["try_lock"], {"name": self.name})
                got = cursor.fetchone()[0]
        except DatabaseError as exc:
            raise errors.ExportError(
                f"export: cannot reach database {self.using!r}: {exc}"
            ) from exc
        if not got:
            raise errors.ExportError(
                f"export: another {self.holder} is running on this database; try again when it ends"
            )

    def __exit__(self, *exc_info) -> None:
        try:
            with connections[self.using].cursor() as cursor:
                cursor.execute(QUERIES["unlock"], {"name": self.name})
        except DatabaseError:
            logger.warning("export: could not release the export lock (connection lost?)")
