"""Where every channel, inbox, outbox and subscription stands, read from the database: the
numbers of the admin overview and of the Prometheus gauges."""

from __future__ import annotations

import dataclasses
import datetime as dt

from django.db import connections

from pgmsg.channels import declarations as channels
from pgmsg.core import conf, sql
from pgmsg.events import subscriptions
from pgmsg.inbox import operations as inbox_operations
from pgmsg.outbox import operations as outbox_operations

QUERIES = sql.load(__package__, "overview.sql")

#: The ``kind`` of a source, as the throughput rows (Delivery.kind) name it.
ROW_KINDS = {"channel": "notification", "inbox": "inbox", "subscription": "event"}
MINUTES = 60


@dataclasses.dataclass
class SourceStatus:
    """One channel, inbox, outbox or subscription."""

    #: "channel", "inbox", "outbox" or "subscription".
    kind: str
    name: str
    #: Messages waiting (a subscription: events after its lowest checkpoint).
    backlog: int = 0
    #: Seconds since the oldest waiting message arrived (0 when none waits).
    oldest_pending_age: float = 0.0
    #: Dead letters (a subscription: stopped partitions).
    dead: int = 0
    handled_last_hour: int = 0
    failed_last_hour: int = 0
    #: Handled per minute over the last hour, oldest first (MINUTES values).
    per_minute: list[int] = dataclasses.field(default_factory=lambda: [0] * MINUTES)

    @property
    def lag(self) -> float:
        """Seconds behind: the oldest waiting message's age."""
        return self.oldest_pending_age


def overview(*, with_throughput: bool = True) -> list[SourceStatus]:
    """Every declared channel (exactly-once), inbox, outbox and subscription, and every
    channel, inbox and outbox with waiting or dead messages in its table, declared in this
    process or not (a removed channel's dead letters, or an inbox only the workers load),
    sorted by kind and name."""
    found: dict[tuple[str, str], SourceStatus] = {}

    def status(kind: str, name: str) -> SourceStatus:
        return found.setdefault((kind, name), SourceStatus(kind, name))

    for name, spec in channels.registry.channels.items():
        if spec.delivery == channels.EXACTLY_ONCE:
            status("channel", name)
    subs = sorted(subscriptions.registry.subscriptions.values(), key=lambda s: s.name)
    with connections[conf.get().DATABASE].cursor() as cursor:
        cursor.execute(QUERIES["notifications"])
        for name, pending, age, dead in cursor.fetchall():
            row = status("channel", name)
            row.backlog, row.oldest_pending_age, row.dead = pending, age, dead
        if subs:
            cursor.execute(
                QUERIES["subscriptions"],
                {"names": [s.name for s in subs], "categories": [s.category for s in subs]},
            )
            for name, events, age, stopped in cursor.fetchall():
                row = status("subscription", name)
                row.backlog, row.oldest_pending_age, row.dead = events, age, stopped
        if with_throughput:
            cursor.execute(QUERIES["throughput"])
            rows = cursor.fetchall()
            cursor.execute(QUERIES["this_minute"])
            now = cursor.fetchone()[0]
        else:
            rows, now = [], None
    for health in inbox_operations.health(stored=True):
        row = status("inbox", health.inbox)
        row.backlog, row.oldest_pending_age, row.dead = (
            health.pending,
            health.oldest_pending_age,
            health.dead,
        )
    for held in outbox_operations.backlog():
        row = status("outbox", held.outbox)
        row.backlog, row.oldest_pending_age, row.dead = (
            held.pending,
            held.oldest_pending_age,
            held.dead,
        )
    kinds = {row_kind: kind for kind, row_kind in ROW_KINDS.items()}
    for row_kind, name, minute, handled, failed in rows:
        row = status(kinds.get(row_kind, row_kind), name)
        index = MINUTES - 1 - int((now - minute) / dt.timedelta(minutes=1))
        if 0 <= index < MINUTES:
            row.per_minute[index] += handled
        row.handled_last_hour += handled
        row.failed_last_hour += failed
    order = {"channel": 0, "inbox": 1, "outbox": 2, "subscription": 3}
    return sorted(found.values(), key=lambda r: (order.get(r.kind, 9), r.name))
