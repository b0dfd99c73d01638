"""Where each bridge stands, as its process reported it (pgmsg_inbox_bridge): connected or
not, the broker's last error, its last message, and its lag where the broker reports one."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable

from django.db import connections

from pgmsg.core import conf, sql
from pgmsg.inbox.bridges import declarations

QUERIES = sql.load(__package__, "bridges.sql")

HEALTHY = "healthy"
DEGRADED = "degraded"
#: A running bridge reports every few seconds (source.REPORT_EVERY); a report older than
#: this says no process runs it.
STALE_AFTER = 30.0


@dataclasses.dataclass(frozen=True)
class BridgeHealth:
    bridge: str
    inbox: str
    #: The broker URL (password hidden) and the queue, stream, subject or topic.
    broker: str
    connected: bool
    last_message_at: dt.datetime | None
    #: Messages waiting in the broker for the bridge (RabbitMQ: the queue's ready messages;
    #: JetStream: pending and unacknowledged; Redis: the group's lag and pending); None where
    #: the broker reports none (MQTT).
    lag: int | None
    #: The broker's last error while it cannot be reached ("" when connected).
    error: str
    #: Seconds since the bridge's process last reported (None: never ran).
    reported_ago: float | None
    status: str
    reasons: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["reasons"] = list(self.reasons)
        data["last_message_at"] = self.last_message_at and self.last_message_at.isoformat()
        data["reported_ago"] = None if self.reported_ago is None else round(self.reported_ago, 1)
        return data


def health(names: Iterable[str] | None = None, *, inbox: str | None = None) -> list[BridgeHealth]:
    """Every declared bridge (or those named, or those feeding ``inbox``), and every bridge
    that reported (declared in this process or not), sorted by name. Degraded when no process
    has reported for STALE_AFTER seconds, or when the bridge cannot reach its broker."""
    wanted = None if names is None else sorted(set(names))
    declared = conf.get().INBOX_BRIDGES
    with connections[conf.get().DATABASE].cursor() as cursor:
        cursor.execute(QUERIES["states"], {"names": wanted})
        found = {row[0]: row for row in cursor.fetchall()}
    result = []
    for name in sorted(set(found) | set(wanted if wanted is not None else declared)):
        row = found.get(name)
        if row is None:
            spec = declarations.get(name)  # raises UnknownBridge for a name never seen
            row = (name, spec.inbox, spec.describe(), False, "", None, None, None)
        health = _health(*row)
        if inbox is None or health.inbox == inbox:
            result.append(health)
    return result


def _health(name, inbox, broker, connected, error, last_message_at, lag, ago) -> BridgeHealth:
    reasons = []
    running = ago is not None and ago < STALE_AFTER
    if ago is None:
        reasons.append("never ran: start manage.py listen")
    elif not running:
        reasons.append(f"not running: no report for {ago:.0f}s")
    elif not connected:
        reasons.append(f"cannot reach the broker: {error or 'not connected'}")
    return BridgeHealth(
        bridge=name,
        inbox=inbox,
        broker=broker,
        connected=bool(connected and running),
        last_message_at=last_message_at,
        lag=lag if running else None,
        error=error,
        reported_ago=ago,
        status=DEGRADED if reasons else HEALTHY,
        reasons=tuple(reasons),
    )
