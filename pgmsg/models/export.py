"""Export watermarks: how far each Parquet dataset has been exported."""

from __future__ import annotations

from django.db import models


class ExportWatermark(models.Model):
    """One row per exported dataset, written only after its Parquet files were committed.

    ``transaction_xmin`` is the snapshot xmin of the last successful run: every row with a
    lower transaction id has been exported, and none with a higher one. Snapshot tables
    (no transaction id) keep it NULL and record only when and how much was exported.
    """

    name = models.CharField(max_length=63, primary_key=True)
    transaction_xmin = models.BigIntegerField(null=True, blank=True)
    last_rows = models.BigIntegerField(default=0)
    total_rows = models.BigIntegerField(default=0)
    exported_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pgmsg_export_watermark"

    def __str__(self) -> str:
        return f"{self.name} @ {self.transaction_xmin}"


class Archive(models.Model):
    """One archived partition: its rows were written to Parquet at ``path``, counted there,
    and only then was the partition dropped (pgmsg/export/archive.py).

    A run records the partition as "exporting" before it writes; "archived" once it is dropped.
    A row left "exporting" is a run that stopped midway: its partition is still in place, and
    the next run exports it again over the same path.
    """

    class Status(models.TextChoices):
        EXPORTING = "exporting", "exporting"
        ARCHIVED = "archived", "archived"

    id = models.BigAutoField(primary_key=True)
    #: The partitioned table and the partition (its name, and the time range it held).
    table = models.CharField(max_length=63)
    partition = models.CharField(max_length=63, unique=True)
    lower = models.DateTimeField()
    upper = models.DateTimeField()
    #: Where the Parquet dataset is.
    path = models.TextField()
    rows = models.BigIntegerField(null=True, blank=True)
    #: The range of the event positions it held.
    first_position = models.BigIntegerField(null=True, blank=True)
    last_position = models.BigIntegerField(null=True, blank=True)
    #: Its last event in the read order (transaction id, position): a subscription whose
    #: checkpoint is before it has not passed every archived event (docs/storage.md).
    end_transaction_id = models.BigIntegerField(null=True, blank=True)
    end_position = models.BigIntegerField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.EXPORTING)
    started_at = models.DateTimeField(auto_now_add=True)
    archived_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pgmsg_archive"

    def __str__(self) -> str:
        return f"{self.partition} -> {self.path} ({self.status})"
