"""Operations on subscriptions: status (with lag), list, reset, retry, skip."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from typing import Literal

from django.db import connections, transaction
from django.utils import timezone

from pgmsg.core import conf, errors, horizon
from pgmsg.events import reads
from pgmsg.events import store as events
from pgmsg.events.subscriptions import (
    QUERIES,
    WAKE_PREFIX,
    Subscription,
    ensure_partitions,
    registry,
)
from pgmsg.models import SubscriptionPartition


def status(name: str | None = None) -> list:
    """The partition rows of one subscription (or all), ordered by name and partition."""
    rows = SubscriptionPartition.objects.using(conf.get().DATABASE).order_by(
        "subscription", "partition"
    )
    return list(rows.filter(subscription=name) if name is not None else rows)


def failing(name: str | None = None) -> list:
    """The partitions an operator may have to act on: stopped, or retrying a failed event."""
    return [row for row in status(name) if row.state != "active"]


#: Lag counts stop here (a partition far behind is reported as at least this many events).
LAG_COUNT_CAP = 100_000


@dataclasses.dataclass(frozen=True)
class Lag:
    """How far one partition is behind the head of the store, and what it handled last."""

    #: Events of the partition stored after its checkpoint (at most LAG_COUNT_CAP counted).
    behind: int
    #: Seconds since the oldest of those events was recorded (0 when caught up).
    behind_seconds: float
    #: Position of the partition's last event at or before the checkpoint (None: none yet).
    last_handled_position: int | None
    last_handled_at: dt.datetime | None

    @property
    def behind_text(self) -> str:
        count = f"{self.behind}+" if self.behind >= LAG_COUNT_CAP else str(self.behind)
        if not self.behind:
            return "0 (caught up)"
        noun = "event" if self.behind == 1 else "events"
        return f"{count} {noun}, {_duration(self.behind_seconds)}"


def lag(row: SubscriptionPartition) -> Lag | None:
    """The lag of one partition row (from status()); None if its subscription is not declared
    in this process (its filters are unknown)."""
    sub = registry.subscriptions.get(row.subscription)
    if sub is None:
        return None
    params = {
        "xid": str(row.checkpoint_transaction),
        "position": row.checkpoint_position,
        "category": sub.category,
        "types": sub.types,
        "partitions": sub.partitions,
        "partition": row.partition,
        "key_source": sub.key_source,
        "key": sub.key,
        "cap": LAG_COUNT_CAP,
    }
    with connections[conf.get().DATABASE].cursor() as cursor:
        cursor.execute(QUERIES["partition_behind"], params)
        behind, oldest = cursor.fetchone()
        cursor.execute(QUERIES["last_handled"], params)
        last = cursor.fetchone()
    seconds = max((timezone.now() - oldest).total_seconds(), 0.0) if oldest else 0.0
    return Lag(
        behind=behind,
        behind_seconds=seconds,
        last_handled_position=last[0] if last else None,
        last_handled_at=last[1] if last else None,
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f}s behind"
    if seconds < 7200:
        return f"{seconds / 60:.1f}min behind"
    return f"{seconds / 3600:.1f}h behind"


def _partitions_arg(sub: Subscription, partitions: Iterable[int] | None) -> list[int]:
    if partitions is None:
        return list(range(sub.partitions))
    chosen = sorted(set(partitions))
    bad = [p for p in chosen if not (isinstance(p, int) and 0 <= p < sub.partitions)]
    if bad:
        raise errors.ConfigurationError(
            f"subscription {sub.name!r} has partitions 0..{sub.partitions - 1}, not {bad}"
        )
    return chosen


def _operate(statement: str, name: str, partitions: Iterable[int] | None, **params) -> int:
    sub = registry.get(name)
    db = conf.get().DATABASE
    with transaction.atomic(using=db), connections[db].cursor() as cursor:
        ensure_partitions(sub, cursor)
        cursor.execute(
            QUERIES[statement],
            {"subscription": name, "partitions": _partitions_arg(sub, partitions), **params},
        )
        count = cursor.rowcount
        cursor.execute(QUERIES["wake"], {"payload": WAKE_PREFIX})
    return count


def reset(
    name: str,
    *,
    to: int | Literal["beginning", "end", "archive"] = "beginning",
    partitions: Iterable[int] | None = None,
) -> int:
    """Move a subscription's partitions (default: all) to a point and make them active again:
    ``"beginning"`` (replay everything), ``"end"`` (pass over everything stored now),
    ``"archive"`` (just after the last archived event: pass over what pgmsg_archive dropped),
    or a position (handle what is read after the event at that position). Waits for workers
    that hold a partition to commit. Returns the number of partitions moved."""
    if to == "beginning":
        point = events.START
    elif to == "archive":
        point = _archive_end()
    elif to == "end":
        point = _horizon_checkpoint()
    elif isinstance(to, int) and not isinstance(to, bool) and to >= 0:
        point = reads.checkpoint_of(to) if to else events.START
    else:
        raise errors.ConfigurationError(
            f"reset {name!r}: 'to' must be 'beginning', 'end', 'archive' or a position, got {to!r}"
        )
    return _operate(
        "reset",
        name,
        partitions,
        xid=point.transaction_id,
        position=point.position,
    )


def _archive_end() -> events.Checkpoint:
    with connections[conf.get().DATABASE].cursor() as cursor:
        cursor.execute(QUERIES["archive_end"])
        row = cursor.fetchone()
    if row is None:
        raise errors.ConfigurationError("reset --to archive: no event partition was archived")
    return events.Checkpoint(row[0], row[1])


def _horizon_checkpoint() -> events.Checkpoint:
    """The end of what is stored now, for readers: their horizon (pgmsg/core/horizon.py), not
    the server-wide xmin, which an open transaction of another database holds back."""
    with connections[conf.get().DATABASE].cursor() as cursor:
        return events.Checkpoint(horizon.horizon(cursor), 0)


def retry(name: str, partitions: Iterable[int] | None = None) -> int:
    """Make stopped (or backing-off) partitions try their failed event again now."""
    return _operate("retry", name, partitions)


def skip(name: str, partitions: Iterable[int] | None = None) -> int:
    """Pass over the failed event of stopped (or retrying) partitions, and carry on after it."""
    return _operate("skip", name, partitions)
