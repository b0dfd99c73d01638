"""Every pgmsg table, in the order a message travels. One module per kind of message."""

from pgmsg.models.events import Snapshot, StoredEvent, Stream, SubscriptionPartition
from pgmsg.models.export import ExportWatermark
from pgmsg.models.inbox import InboxMessage
from pgmsg.models.notifications import Notification

__all__ = [
    "ExportWatermark",
    "InboxMessage",
    "Notification",
    "Snapshot",
    "StoredEvent",
    "Stream",
    "SubscriptionPartition",
]
