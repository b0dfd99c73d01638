"""Batch claims recorded outside the batch's transaction, so that a crash leaves a trace."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models.functions import Now


class Claim(models.Model):
    """The rows one batch transaction ran, written (autocommit) before its handlers start.

    A claim whose transaction committed is garbage (its worker's next record replaces it;
    a worker's first record deletes those of stopped workers). One whose
    transaction aborted is a batch that died with its worker process: each of its ids is a
    suspect, charged a crash only when it ran alone (see pgmsg/core/claims.py).
    """

    id = models.BigAutoField(primary_key=True)
    #: What kind of row the ids name: "notification", ...
    kind = models.CharField(max_length=20)
    ids = ArrayField(models.BigIntegerField())
    #: The claiming transaction's id (xid8 as a number), for pg_xact_status().
    transaction_id = models.BigIntegerField()
    #: The worker's process id, for people reading the table.
    pid = models.IntegerField()
    claimed_at = models.DateTimeField(db_default=Now())
    #: Whether the batch ran one row: only then is its death charged to that row as a crash
    #: (the rows of a batch of several that died are suspects without a charge).
    alone = models.BooleanField(default=False, db_default=False)

    class Meta:
        db_table = "pgmsg_claim"

    def __str__(self) -> str:
        return f"{self.kind} claim of {len(self.ids)} by pid {self.pid}"
