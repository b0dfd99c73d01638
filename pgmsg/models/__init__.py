"""Every pgmsg table, in the order a message travels. One module per kind of message."""

from pgmsg.models.bridges import InboxBridge
from pgmsg.models.claims import Claim
from pgmsg.models.events import EventKey, Snapshot, StoredEvent, Stream, SubscriptionPartition
from pgmsg.models.export import Archive, ExportWatermark
from pgmsg.models.inbox import InboxDeadLetter, InboxKey, InboxMessage
from pgmsg.models.notifications import Notification, NotificationDeadLetter
from pgmsg.models.outbox import OutboxKey, OutboxMessage
from pgmsg.models.throughput import Overview, Throughput

__all__ = [
    "Archive",
    "Claim",
    "EventKey",
    "ExportWatermark",
    "InboxBridge",
    "InboxDeadLetter",
    "InboxKey",
    "InboxMessage",
    "Notification",
    "NotificationDeadLetter",
    "OutboxKey",
    "OutboxMessage",
    "Overview",
    "Snapshot",
    "StoredEvent",
    "Stream",
    "SubscriptionPartition",
    "Throughput",
]
