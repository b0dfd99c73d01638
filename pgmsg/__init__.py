"""pgmsg: PostgreSQL-native messaging for Django.

The public API, re-exported lazily: Django imports this package before models are ready,
so nothing here may import a module that imports models at import time. No submodule may
share a name with an export (importing it would shadow the export on the package).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports on first use
    from pgmsg import live
    from pgmsg.channels.deadletters import dead_letters, discard, replay
    from pgmsg.channels.declarations import BROADCAST, EXACTLY_ONCE, Channel, listener
    from pgmsg.channels.sending import anotify, anotify_many, notify, notify_many
    from pgmsg.channels.triggers import ChannelTrigger, RowChange
    from pgmsg.core import errors
    from pgmsg.core.batch import current_delivery
    from pgmsg.core.worker import Worker
    from pgmsg.events.aggregates import Aggregate, Repository
    from pgmsg.events.reads import aread_all, aread_stream, read_all, read_stream
    from pgmsg.events.store import (
        ANY,
        NO_STREAM,
        START,
        Checkpoint,
        Event,
        RecordedEvent,
        aappend,
        append,
    )
    from pgmsg.events.subscriptions import Subscription
    from pgmsg.export import export_tables
    from pgmsg.inbox.declarations import (
        Inbox,
        InboxMessage,
        areceive,
        areceive_many,
        inbox_handler,
        receive,
        receive_many,
    )
    from pgmsg.inbox.model_inbox import ModelInbox
    from pgmsg.inbox.operations import inbox_health
    from pgmsg.outbox.declarations import Outbox, apublish, apublish_many, publish, publish_many
    from pgmsg.outbox.operations import outbox_health

_EXPORTS = {
    "ANY": "pgmsg.events.store",
    "Aggregate": "pgmsg.events.aggregates",
    "BROADCAST": "pgmsg.channels.declarations",
    "Channel": "pgmsg.channels.declarations",
    "ChannelTrigger": "pgmsg.channels.triggers",
    "Checkpoint": "pgmsg.events.store",
    "EXACTLY_ONCE": "pgmsg.channels.declarations",
    "Event": "pgmsg.events.store",
    "Inbox": "pgmsg.inbox.declarations",
    "InboxMessage": "pgmsg.inbox.declarations",
    "ModelInbox": "pgmsg.inbox.model_inbox",
    "NO_STREAM": "pgmsg.events.store",
    "Outbox": "pgmsg.outbox.declarations",
    "RecordedEvent": "pgmsg.events.store",
    "Repository": "pgmsg.events.aggregates",
    "RowChange": "pgmsg.channels.triggers",
    "START": "pgmsg.events.store",
    "Subscription": "pgmsg.events.subscriptions",
    "Worker": "pgmsg.core.worker",
    "aappend": "pgmsg.events.store",
    "anotify": "pgmsg.channels.sending",
    "anotify_many": "pgmsg.channels.sending",
    "append": "pgmsg.events.store",
    "apublish": "pgmsg.outbox.declarations",
    "apublish_many": "pgmsg.outbox.declarations",
    "aread_all": "pgmsg.events.reads",
    "aread_stream": "pgmsg.events.reads",
    "areceive": "pgmsg.inbox.declarations",
    "areceive_many": "pgmsg.inbox.declarations",
    "current_delivery": "pgmsg.core.batch",
    "dead_letters": "pgmsg.channels.deadletters",
    "discard": "pgmsg.channels.deadletters",
    "export_tables": "pgmsg.export.run",
    "inbox_handler": "pgmsg.inbox.declarations",
    "inbox_health": "pgmsg.inbox.operations",
    "listener": "pgmsg.channels.declarations",
    "notify": "pgmsg.channels.sending",
    "notify_many": "pgmsg.channels.sending",
    "outbox_health": "pgmsg.outbox.operations",
    "publish": "pgmsg.outbox.declarations",
    "publish_many": "pgmsg.outbox.declarations",
    "read_all": "pgmsg.events.reads",
    "read_stream": "pgmsg.events.reads",
    "receive": "pgmsg.inbox.declarations",
    "receive_many": "pgmsg.inbox.declarations",
    "replay": "pgmsg.channels.deadletters",
}

__all__ = [
    "ANY",
    "Aggregate",
    "BROADCAST",
    "Channel",
    "ChannelTrigger",
    "Checkpoint",
    "EXACTLY_ONCE",
    "Event",
    "Inbox",
    "InboxMessage",
    "ModelInbox",
    "NO_STREAM",
    "Outbox",
    "RecordedEvent",
    "Repository",
    "RowChange",
    "START",
    "Subscription",
    "Worker",
    "aappend",
    "anotify",
    "anotify_many",
    "append",
    "apublish",
    "apublish_many",
    "aread_all",
    "aread_stream",
    "areceive",
    "areceive_many",
    "current_delivery",
    "dead_letters",
    "discard",
    "errors",
    "export_tables",
    "inbox_handler",
    "inbox_health",
    "listener",
    "live",
    "notify",
    "notify_many",
    "outbox_health",
    "publish",
    "publish_many",
    "read_all",
    "read_stream",
    "receive",
    "receive_many",
    "replay",
]


#: Modules re-exported as attributes: ``pgmsg.errors``, and ``pgmsg.live`` (the live endpoint,
#: docs/live.md), imported on first use.
_MODULES = {"errors": "pgmsg.core.errors", "live": "pgmsg.live"}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pgmsg' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
