"""Handled and failed messages per minute and source: the admin overview's last hour."""

from __future__ import annotations

from django.db import models


class Throughput(models.Model):
    """What one worker process handled in one minute from one source (channel, inbox,
    subscription). Written in the claim transaction, so it counts only what committed; one
    row per process keeps concurrent workers from waiting on each other's row. Rows older
    than two hours are deleted by the workers."""

    id = models.BigAutoField(primary_key=True)
    minute = models.DateTimeField()
    #: "notification", "inbox" or "event" (a subscription's).
    kind = models.CharField(max_length=16)
    source = models.CharField(max_length=63)
    pid = models.IntegerField()
    handled = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)

    class Meta:
        db_table = "pgmsg_throughput"
        constraints = [
            models.UniqueConstraint(
                fields=["minute", "kind", "source", "pid"], name="pgmsg_throughput_key"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.source} @ {self.minute:%H:%M}: {self.handled}"


class Overview(Throughput):
    """The admin's "pgmsg overview" page (pgmsg/admin/overview.py): no table of its own; its
    view permission (``pgmsg.view_overview``) opens the page and shows counts; a dead letter's
    payload and error need its own model's view permission."""

    class Meta:
        proxy = True
        # A page to look at: adding, changing or deleting it means nothing.
        default_permissions = ("view",)
        verbose_name = "pgmsg overview"
        verbose_name_plural = "pgmsg overview"
