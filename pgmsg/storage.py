"""pgmsg's partitioned tables together: what manage.py pgmsg_partitions makes and lists."""

from __future__ import annotations

from django.db import connections

from pgmsg.core import conf, partitions
from pgmsg.events import partitions as event_partitions
from pgmsg.inbox import retention as inbox_retention
from pgmsg.outbox import partitions as outbox_partitions

#: The partitioned tables, each with the function that makes its partitions ahead.
TABLES = {
    event_partitions.TABLE: event_partitions.ensure_partitions,
    inbox_retention.TABLE: inbox_retention.ensure_partitions,
    outbox_partitions.TABLE: outbox_partitions.ensure_partitions,
}


def ensure_partitions() -> list[str]:
    """Create every partition pgmsg needs ahead of time; returns the names created."""
    created = []
    for ensure in TABLES.values():
        created += ensure()
    return created


def drop_emptied() -> list[str]:
    """Drop the partitions that hold nothing any more (the outbox's past weeks whose every
    message was relayed or discarded), and trim the keys of the outbox's relayed messages;
    returns the names dropped."""
    dropped = outbox_partitions.drop_emptied()
    outbox_partitions.trim_keys()
    return dropped


def seal_partitions() -> list[str]:
    """Seal the event store's ended months (pgmsg/events/partitions.py); returns their names."""
    return event_partitions.seal_partitions()


def partition_list() -> list[tuple[str, partitions.Partition]]:
    """(table, partition) of every partitioned table of pgmsg."""
    with connections[conf.get().DATABASE].cursor() as cursor:
        return [(t, p) for t in TABLES for p in partitions.partitions(cursor, t)]
