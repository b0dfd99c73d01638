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
