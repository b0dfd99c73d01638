"""Operating inboxes: health, listing, per-type statistics, gap check, replay, discard and
retention."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from django.db import connections, transaction
from django.db.models import Count

from pgmsg.core import conf, errors, horizon, names, sql
from pgmsg.inbox import declarations as inbox
from pgmsg.inbox import model_inbox, retention

logger = logging.getLogger(__name__)

QUERIES = sql.load(__package__, "inbox.sql")

HEALTHY = "healthy"
DEGRADED = "degraded"
#: Rows deleted per retention statement: keeps each delete's locks and WAL burst small.
PURGE_CHUNK = 5000


@dataclasses.dataclass(frozen=True)
class InboxHealth:
    inbox: str
    pending: int
    dead: int
    #: Seconds since the oldest pending message was received (0 when none is pending).
    oldest_pending_age: float
    #: Messages processed in the last 60 seconds.
    processed_last_minute: int
    status: str
    #: Why the status is degraded (empty when healthy).
    reasons: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["reasons"] = list(self.reasons)
        data["oldest_pending_age"] = round(self.oldest_pending_age, 3)
        return data


def health(names: Iterable[str] | None = None, *, stored: bool = False) -> list[InboxHealth]:
    """Health of the named inboxes (default: every declared inbox), sorted by name. With
    ``stored``, also every inbox whose pending or dead messages are in the table, declared in
    this process or not (the admin overview of a web process that loads no inbox).

    Degraded when pending >= PGMSG INBOX_DEGRADED_PENDING, dead >= INBOX_DEGRADED_DEAD, or the
    oldest pending message is INBOX_DEGRADED_AGE seconds old or more.
    """
    wanted = _names(names)
    settings = conf.get()
    with connections[settings.DATABASE].cursor() as cursor:
        if stored:
            cursor.execute(QUERIES["stored_names"])
            wanted = sorted(set(wanted) | {row[0] for row in cursor.fetchall()})
        cursor.execute(QUERIES["health"], {"inboxes": wanted})
        found = {row[0]: row[1:] for row in cursor.fetchall()}
    result = []
    blockers = None
    for name in wanted:
        pending, dead, age, throughput = found.get(name, (0, 0, 0.0, 0))
        spec = inbox.registry.inboxes.get(name)
        if isinstance(spec, model_inbox.ModelInbox):
            # A model inbox's messages are its model's rows; its own rows here are failures.
            pending, throughput = model_inbox.counts(spec)
            age = 0.0
        reasons = []
        if pending >= settings.INBOX_DEGRADED_PENDING:
            reasons.append(f"{pending} pending (threshold {settings.INBOX_DEGRADED_PENDING})")
        if dead >= settings.INBOX_DEGRADED_DEAD:
            reasons.append(f"{dead} dead (threshold {settings.INBOX_DEGRADED_DEAD})")
        if pending and getattr(spec, "ordered", False) and blockers is None:
            blockers = horizon.blockers()
        if pending and getattr(spec, "ordered", False) and blockers:
            # Ordered messages wait for the transactions that were open when they arrived.
            reasons.append(f"read horizon held back by {blockers[0]}")
        if age >= settings.INBOX_DEGRADED_AGE:
            reasons.append(
                f"oldest pending is {age:.0f}s old (threshold {settings.INBOX_DEGRADED_AGE:g}s)"
            )
        result.append(
            InboxHealth(
                inbox=name,
                pending=pending,
                dead=dead,
                oldest_pending_age=age,
                processed_last_minute=throughput,
                status=DEGRADED if reasons else HEALTHY,
                reasons=tuple(reasons),
            )
        )
    return result


@dataclasses.dataclass(frozen=True)
class TypeStats:
    type: str
    #: Messages held (received and not yet deleted by retention).
    received: int
    processed: int
    pending: int
    dead: int
    discarded: int


def stats(name: str) -> list[TypeStats]:
    """Per message type counts of one inbox, sorted by type."""
    inbox.registry.get(name)
    with connections[conf.get().DATABASE].cursor() as cursor:
        cursor.execute(QUERIES["stats"], {"inbox": name})
        return [TypeStats(*row) for row in cursor.fetchall()]


@dataclasses.dataclass(frozen=True)
class Gap:
    """An aggregate of an ordered inbox held back by its failed head message."""

    aggregate_id: str
    head_id: int
    message_id: str
    type: str
    #: "dead", or "pending" (backing off after failures).
    status: str
    attempts: int
    last_error: str
    #: Messages of the aggregate waiting behind the head.
    waiting: int

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def gaps(name: str) -> list[Gap]:
    """Aggregates whose head failed, oldest head first (ordered inboxes; [] otherwise)."""
    if not inbox.registry.get(name).ordered:
        return []
    with connections[conf.get().DATABASE].cursor() as cursor:
        cursor.execute(QUERIES["gaps"], {"inbox": name})
        return [Gap(*row) for row in cursor.fetchall()]


#: The states list() takes: those of the model, and "retrying" (pending after a failure).
STATES = ("pending", "retrying", "processed", "dead", "discarded")


def messages(name: str | None = None, *, state: str = "dead"):
    """Messages of one inbox (or all) in ``state``, oldest first (a queryset)."""
    from pgmsg.models import InboxMessage

    if state not in STATES:
        raise errors.InvalidMessage(f"state must be one of {STATES}, got {state!r}")
    rows = InboxMessage.objects.using(conf.get().DATABASE)
    if name is not None:
        rows = rows.filter(inbox=names.validate_name(name, kind="inbox"))
    if state == "retrying":
        rows = rows.filter(status="pending", attempts__gt=0)
    else:
        rows = rows.filter(status=state)
    return rows.order_by("id")


def dead_letters(name: str | None = None):
    """Dead messages of one inbox (or all), oldest first (a queryset)."""
    return messages(name, state="dead")


def dead_letter_counts() -> dict[str, int]:
    """How many dead messages each inbox holds (inboxes with none are left out)."""
    rows = dead_letters().values("inbox").annotate(n=Count("id")).order_by("inbox")
    return dict(rows.values_list("inbox", "n"))


def replay(name: str, ids: Iterable[int] | None = None, *, type: str | None = None) -> int:
    """Make dead (or retrying) messages of inbox ``name`` due now with a fresh attempt count.

    By ``ids``, or every such message of ``type``. Returns how many; workers wake at commit.
    """
    id_list, type_ = _selection(name, ids, type)
    with transaction.atomic(using=conf.get().DATABASE):
        with connections[conf.get().DATABASE].cursor() as cursor:
            cursor.execute(QUERIES["replay"], {"inbox": name, "ids": id_list, "type": type_})
            count = cursor.fetchone()[0]
    logger.info("pgmsg: replayed %s message(s) of inbox %r", count, name)
    return count


def discard(
    name: str, ids: Iterable[int] | None = None, *, type: str | None = None, reason: str
) -> int:
    """Settle dead or pending messages without handling them, keeping ``reason``.

    A discarded head of an ordered aggregate lets the messages behind it proceed.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise errors.InvalidMessage(f"discard needs a non-empty reason, got {reason!r}")
    id_list, type_ = _selection(name, ids, type)
    with transaction.atomic(using=conf.get().DATABASE):
        with connections[conf.get().DATABASE].cursor() as cursor:
            cursor.execute(
                QUERIES["discard"], {"inbox": name, "ids": id_list, "type": type_, "reason": reason}
            )
            count = cursor.fetchone()[0]
    logger.info("pgmsg: discarded %s message(s) of inbox %r: %s", count, name, reason)
    return count


def purge(
    names: Iterable[str] | None = None, *, chunks: int | None = None, by_partition: bool = True
) -> dict[str, int]:
    """Retention: remove processed messages older than PGMSG INBOX_RETENTION and dead or
    discarded ones older than INBOX_DEAD_RETENTION (a dead head that holds an ordered
    aggregate back is kept).

    Processed messages go a whole partition at a time, across every inbox (retention.py):
    a partition that keeps more than retention.MOST_KEPT rows waits for a later pass. Dead
    and discarded messages of ``names`` left in such partitions are then deleted (they are
    few); ``chunks`` bounds those delete statements (None: until done). ``by_partition=False``
    leaves the partitions to retention.maintain() (the workers' periodic pass). When anything
    was removed, the keys of the removed messages go too (retention.trim_keys).

    Returns the counts removed, as {"processed": n, "dead": m}.
    """
    wanted = _names(names)
    ordered = [
        n for n in wanted if n in inbox.registry.inboxes and inbox.registry.inboxes[n].ordered
    ]
    settings = conf.get()
    deleted = retention.drop_expired() if by_partition else {"processed": 0, "dead": 0}
    done = 0
    while chunks is None or done < chunks:
        with connections[settings.DATABASE].cursor() as cursor:
            cursor.execute(
                QUERIES["purge_dead"],
                {
                    "inboxes": wanted,
                    "ordered": ordered,
                    "seconds": settings.INBOX_DEAD_RETENTION,
                    "limit": PURGE_CHUNK,
                },
            )
            count = cursor.rowcount
        deleted["dead"] += count
        done += 1
        if count < PURGE_CHUNK:
            break
    if deleted["processed"] or deleted["dead"]:
        logger.info("pgmsg: inbox retention removed %s", deleted)
        retention.trim_keys()
    return deleted


def missing(name: str, ids: Iterable[int], *, action: str) -> list[int]:
    """The ``ids`` that ``action`` ("replay" or "discard") would not find in inbox ``name``:
    replay takes dead and retrying messages, discard dead and pending ones. Sorted."""
    wanted = {int(i) for i in ids}
    states = ("dead", "retrying") if action == "replay" else ("dead", "pending")
    found: set[int] = set()
    for state in states:
        found.update(messages(name, state=state).filter(id__in=wanted).values_list("id", flat=True))
    return sorted(wanted - found)


def inboxes_of(ids: Iterable[int]) -> dict[int, str]:
    """The inbox of each of ``ids`` that is an inbox message row (whatever its state)."""
    from pgmsg.models import InboxMessage

    rows = InboxMessage.objects.using(conf.get().DATABASE).filter(id__in=list(ids))
    return dict(rows.values_list("id", "inbox"))


def _names(names: Iterable[str] | None) -> list[str]:
    if names is None:
        return sorted(inbox.registry.inboxes)
    names = sorted(set(names))
    for name in names:
        inbox.registry.get(name)
    return names


def _selection(name: str, ids: Iterable[int] | None, type_: str | None) -> tuple[list[int], str]:
    # Rows of an inbox whose declaration was removed can still be replayed or discarded.
    names.validate_name(name, kind="inbox")
    id_list = [int(i) for i in ids] if ids is not None else []
    if not id_list and not type_:
        raise errors.InvalidMessage(
            f"inbox {name!r}: name the messages: ids=[...] or type=... "
            "(every dead letter: ids=dead_letters(name).values_list('id', flat=True))"
        )
    return id_list, type_


#: health() under the name pgmsg exports it as.
inbox_health = health
