"""Where each inbox bridge stands, written by the process that runs it (inbox/bridges/)."""

from __future__ import annotations

from django.db import models


class InboxBridge(models.Model):
    """One row per bridge that ran: connected or not, the broker's last error, the time of
    its last message, and the lag the broker reports (None where it reports none). The
    bridge's process writes it when its state changes and at most every few seconds while it
    runs (``updated_at``: a row not written for long is a bridge not running)."""

    name = models.CharField(max_length=63, primary_key=True)
    inbox = models.CharField(max_length=63)
    #: The broker URL with its password hidden, and the queue, stream, subject or topic.
    broker = models.TextField()
    connected = models.BooleanField(default=False)
    error = models.TextField(blank=True, default="")
    last_message_at = models.DateTimeField(null=True, blank=True)
    lag = models.BigIntegerField(null=True, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "pgmsg_inbox_bridge"
        verbose_name = "inbox bridge"
