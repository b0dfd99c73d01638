"""pgmsg: PostgreSQL-native messaging for Django.

The public API, re-exported lazily: Django imports this package before models are ready,
so nothing here may import a module that imports models at import time. No submodule may
share a name with an export (importing it would shadow the export on the package).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ANY": "pgmsg.events",
    "Aggregate": "pgmsg.aggregates",
    "BROADCAST": "pgmsg.channels",
    "Channel": "pgmsg.channels",
    "ChannelTrigger": "pgmsg.triggers",
    "EXACTLY_ONCE": "pgmsg.channels",
    "Event": "pgmsg.events",
    "Inbox": "pgmsg.inbox",
    "InboxMessage": "pgmsg.inbox",
    "ModelInbox": "pgmsg.model_inbox",
    "NO_STREAM": "pgmsg.events",
    "RecordedEvent": "pgmsg.events",
    "Repository": "pgmsg.aggregates",
    "RowChange": "pgmsg.triggers",
    "Subscription": "pgmsg.subscriptions",
    "Worker": "pgmsg.worker",
    "append": "pgmsg.events",
    "current_delivery": "pgmsg.worker",
    "dead_letters": "pgmsg.deadletter",
    "discard": "pgmsg.deadletter",
    "export_tables": "pgmsg.export",
    "inbox_handler": "pgmsg.inbox",
    "inbox_health": "pgmsg.inbox_ops",
    "listener": "pgmsg.channels",
    "notify": "pgmsg.sending",
    "notify_many": "pgmsg.sending",
    "read_all": "pgmsg.events",
    "read_stream": "pgmsg.events",
    "receive": "pgmsg.inbox",
    "receive_many": "pgmsg.inbox",
    "replay": "pgmsg.deadletter",
}

__all__ = sorted([*_EXPORTS, "errors"])


def __getattr__(name: str) -> Any:
    if name == "errors":
        return importlib.import_module("pgmsg.errors")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pgmsg' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
