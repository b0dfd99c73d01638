"""Operating outboxes: dead letters (list, replay, discard) and health."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from django.db import DatabaseError, connections, transaction
from django.db.models import Q

from pgmsg.core import conf, errors, locks, sql
from pgmsg.outbox import declarations, slots

logger = logging.getLogger(__name__)

QUERIES = sql.load(__package__, "outbox.sql")
SLOT_QUERIES = sql.load(__package__, "logical.sql")

HEALTHY = "healthy"
DEGRADED = "degraded"
#: Refusals of one pending message from which its outbox is degraded: the broker said no
#: twice in a row (a missing exchange or stream says no on every try).
FAILING_ATTEMPTS = 2


def dead_letters(outbox: str | None = None):
    """Dead outbox messages, oldest first, optionally of one outbox (a queryset)."""
    from pgmsg.models import OutboxMessage  # models load after this module (app registry)

    rows = OutboxMessage.objects.using(conf.get().DATABASE).filter(status="dead")
    if outbox is not None:
        rows = rows.filter(outbox=outbox)
    return rows.order_by("id")


def replay(ids: Iterable[int] | None = None, *, outbox: str | None = None) -> int:
    """Make dead (or retrying) messages due now with a fresh attempt count: by ``ids``, or
    every dead letter of ``outbox``. Returns how many; relays are woken at commit."""
    id_list = _select(ids, outbox)
    with transaction.atomic(using=conf.get().DATABASE):
        with connections[conf.get().DATABASE].cursor() as cursor:
            cursor.execute(QUERIES["replay"], {"ids": id_list})
            count = cursor.fetchone()[0]
    logger.info("pgmsg: replayed %s outbox message(s)", count)
    return count


def discard(
    ids: Iterable[int] | None = None, *, outbox: str | None = None, reason: str = ""
) -> int:
    """Delete dead or pending messages for good, unpublished: by ``ids``, or every dead
    letter of ``outbox``. A key held back by a discarded message moves on.

    The rows are gone afterwards: the log line (ids, and ``reason``, e.g. who asked) is the
    record of what was discarded.
    """
    id_list = _select(ids, outbox)
    with transaction.atomic(using=conf.get().DATABASE):
        with connections[conf.get().DATABASE].cursor() as cursor:
            cursor.execute(QUERIES["discard"], {"ids": id_list})
            count = cursor.fetchone()[0]
    logger.warning(
        "pgmsg: discarded %s outbox message(s) of ids %s%s",
        count,
        id_list,
        f": {reason}" if reason else "",
    )
    return count


def missing(ids: Iterable[int], *, action: str) -> list[int]:
    """The ``ids`` that ``action`` ("replay" or "discard") would not find: replay takes dead
    and retrying messages, discard dead and pending ones. Sorted."""
    from pgmsg.models import OutboxMessage

    wanted = {int(i) for i in ids}
    rows = OutboxMessage.objects.using(conf.get().DATABASE).filter(id__in=wanted)
    if action == "replay":
        rows = rows.filter(Q(status="dead") | Q(status="pending", attempts__gt=0))
    else:
        rows = rows.filter(status__in=("dead", "pending"))
    return sorted(wanted - set(rows.values_list("id", flat=True)))


def _select(ids: Iterable[int] | None, outbox: str | None) -> list[int]:
    if ids is not None:
        return [int(i) for i in ids]
    if outbox is None:
        raise errors.InvalidOutboxMessage("name the messages: ids=[...] or outbox=...")
    return list(dead_letters(outbox).values_list("id", flat=True))


@dataclasses.dataclass(frozen=True)
class OutboxHealth:
    outbox: str
    destination: str
    pending: int
    dead: int
    #: Seconds since the oldest pending message was written (0 when none is pending): the lag.
    oldest_pending_age: float
    partitions: int
    #: Partitions a relay holds now.
    relayed_partitions: tuple[int, ...]
    status: str
    reasons: tuple[str, ...] = ()
    #: Pending messages the broker refused FAILING_ATTEMPTS times or more (heads that keep
    #: failing), and the broker's latest error for one of them ("" when none).
    failing: int = 0
    last_error: str = ""
    #: "table" or "logical"; the slot fields are None in table mode.
    capture: str = "table"
    #: Logical mode: the outbox's replication slot (None: not created yet).
    slot: str | None = None
    #: Bytes of WAL from the slot's confirmed position to the server's current one: what the
    #: relay has not confirmed (other databases' writes count too: WAL is per server).
    slot_lag_bytes: int | None = None
    #: Bytes of WAL the slot keeps from being recycled (from its restart position).
    slot_retained_bytes: int | None = None
    #: Seconds since the commit of the oldest transaction with a message the relay has not
    #: confirmed (0: none waits; None: unknown, the relay was reading the slot at that moment).
    slot_age: float | None = None
    #: Logical mode: the slot's wal_status (reserved, extended, unreserved: past
    #: max_slot_wal_keep_size, lost at the next checkpoint; lost: invalidated).
    slot_wal_status: str | None = None

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["reasons"] = list(self.reasons)
        data["relayed_partitions"] = list(self.relayed_partitions)
        data["oldest_pending_age"] = round(self.oldest_pending_age, 3)
        if self.slot_age is not None:
            data["slot_age"] = round(self.slot_age, 3)
        return data


@dataclasses.dataclass(frozen=True)
class OutboxBacklog:
    outbox: str
    pending: int
    dead: int
    #: Seconds since the oldest pending message was written (0 when none is pending).
    oldest_pending_age: float


def backlog() -> list[OutboxBacklog]:
    """Pending and dead messages of every outbox, declared in this process or with messages
    in the table (the admin overview of a web process that loads no outbox), sorted by name.
    Counted from the table: in logical mode, messages still in the WAL are not counted (see
    health()'s slot fields)."""
    with connections[conf.get().DATABASE].cursor() as cursor:
        cursor.execute(QUERIES["backlog"])
        found = {row[0]: OutboxBacklog(*row) for row in cursor.fetchall()}
    for name in declarations.registry.outboxes:
        found.setdefault(name, OutboxBacklog(name, 0, 0, 0.0))
    return sorted(found.values(), key=lambda b: b.outbox)


def health(names: Iterable[str] | None = None) -> list[OutboxHealth]:
    """Health of the named outboxes (default: every declared one), sorted by name.

    Degraded when a message is dead, the oldest pending message is PGMSG OUTBOX_DEGRADED_AGE
    seconds old or more, a pending message was refused FAILING_ATTEMPTS times or more (its
    key's head keeps failing: the broker's last error is given), or messages are pending
    while no relay holds some partition; in
    logical mode also when the slot is missing or its oldest unconfirmed message is that old.
    """
    registry = declarations.registry
    wanted = sorted(registry.outboxes) if names is None else sorted(set(names))
    for name in wanted:
        registry.get(name)
    settings = conf.get()
    with connections[settings.DATABASE].cursor() as cursor:
        cursor.execute(
            QUERIES["health"],
            {"outboxes": wanted, "failing": FAILING_ATTEMPTS, "lock_space": locks.OUTBOX},
        )
        found = {row[0]: row[1:] for row in cursor.fetchall()}
    result = []
    for name in wanted:
        spec = registry.get(name)
        pending, dead, age, held, failing, last_error = found[name]
        held = tuple(p for p in held if p < spec.partitions)
        last_error = (last_error.strip().splitlines() or [""])[-1]
        reasons = _table_reasons(spec, settings, pending, dead, age, held, failing, last_error)
        slot_fields: dict = {}
        if spec.capture == "logical":
            slot_fields = _slot_health(name, settings.DATABASE)
            reasons += _slot_reasons(name, slot_fields, held, settings)
        result.append(
            OutboxHealth(
                outbox=name,
                capture=spec.capture,
                **slot_fields,
                destination=spec.destination,
                pending=pending,
                dead=dead,
                oldest_pending_age=age,
                partitions=spec.partitions,
                relayed_partitions=held,
                status=DEGRADED if reasons else HEALTHY,
                reasons=tuple(reasons),
                failing=failing,
                last_error=last_error,
            )
        )
    return result


def _table_reasons(spec, settings, pending, dead, age, held, failing, last_error) -> list[str]:
    """Why the outbox's table makes it degraded (none: healthy)."""
    reasons = []
    if dead:
        reasons.append(f"{dead} dead")
    if failing:
        reasons.append(
            f"{failing} pending refused {FAILING_ATTEMPTS}+ times by the broker, last: {last_error}"
        )
    if age >= settings.OUTBOX_DEGRADED_AGE:
        reasons.append(
            f"oldest pending is {age:.0f}s old (threshold {settings.OUTBOX_DEGRADED_AGE:g}s)"
        )
    if pending and len(held) < spec.partitions:
        reasons.append(
            f"{pending} pending and no relay holds partition(s) "
            f"{sorted(set(range(spec.partitions)) - set(held))}"
        )
    return reasons


def _slot_reasons(name: str, slot_fields: dict, held: tuple, settings) -> list[str]:
    """Why a logical outbox's replication slot makes it degraded (none: healthy)."""
    reasons = []
    slot_age = slot_fields.get("slot_age")  # absent while there is no slot
    wal_status = slot_fields.get("slot_wal_status")
    if slot_fields["slot"] is None:
        reasons.append("no replication slot yet: start its relay")
    elif wal_status == "lost":
        reasons.append(
            f"replication slot {slot_fields['slot']} was invalidated (wal_status lost): "
            "its unrelayed messages are gone; the relay stops and publish() raises "
            f"until `manage.py pgmsg_outbox drop-slot {name} --yes`"
        )
    elif wal_status == "unreserved":
        reasons.append(
            f"replication slot {slot_fields['slot']} holds more WAL than "
            "max_slot_wal_keep_size (wal_status unreserved): it is invalidated at the "
            "next checkpoint unless its relay catches up"
        )
    elif slot_age is not None and slot_age >= settings.OUTBOX_DEGRADED_AGE:
        reasons.append(
            f"oldest unrelayed message in the slot is {slot_age:.0f}s old "
            f"(threshold {settings.OUTBOX_DEGRADED_AGE:g}s, "
            f"{slot_fields['slot_lag_bytes']} bytes of WAL behind)"
        )
    if slot_fields["slot"] is not None and not held:
        reasons.append("no relay reads the slot, which keeps WAL meanwhile")
    return reasons


def _slot_health(outbox: str, using: str) -> dict:
    slot = slots.slot_name(outbox, using=using)
    with connections[using].cursor() as cursor:
        cursor.execute(SLOT_QUERIES["slot_health"], {"slots": [slot]})
        found = cursor.fetchone()
    if found is None:
        return {"slot": None}
    _, lag, retained, wal_status = found
    return {
        "slot": slot,
        "slot_lag_bytes": lag,
        "slot_retained_bytes": retained,
        "slot_wal_status": wal_status,
        "slot_age": None if wal_status == "lost" else _oldest_unrelayed_age(slot, using),
    }


def _oldest_unrelayed_age(slot: str, using: str) -> float | None:
    """Peek one transaction past the slot's position (a BEGIN with its commit time). The slot
    is busy while its relay reads it: then the age is unknown (None), not an error."""
    try:
        with transaction.atomic(using=using), connections[using].cursor() as cursor:
            cursor.execute(SLOT_QUERIES["oldest_unrelayed"], {"slot": slot})
            first = cursor.fetchone()
    except DatabaseError:
        return None
    if first is None:
        return 0.0
    begin, now = first
    return max((now - slots.commit_time(bytes(begin))).total_seconds(), 0.0)


#: health() under the name pgmsg exports it as.
outbox_health = health


def unrelayed_messages(outbox: str, *, using: str | None = None) -> list:
    """The messages a logical outbox's slot holds that its relay has not confirmed (envelopes,
    in commit order): what dropping the slot would lose. Reads the slot under the outbox's
    relay lock: raises ReplicationSlotInUse while a relay holds the outbox or another session
    reads the slot, ReplicationSlotLost when the slot was invalidated (they cannot be read)."""
    from pgmsg.outbox import logical_source  # the relay's modules load only where they are used

    using = using or conf.get().DATABASE
    found = slots.state(outbox, using=using)
    if found is None:
        return []
    if found.lost:
        raise slots.lost_error(outbox, found)
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        slots.lock_out_relays(cursor, outbox, found)
        try:
            cursor.execute(SLOT_QUERIES["peek"], {"slot": found.slot, "limit": None})
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != slots.SLOT_IN_USE:
                raise
            raise errors.ReplicationSlotInUse(
                f"a session is reading the slot {found.slot!r} of outbox {outbox!r} right now "
                "(health's look, or a peek by hand): try again"
            ) from exc
        transactions = logical_source.decode(cursor.fetchall(), outbox)
    return [e for _, messages in transactions for e in messages]


def drop_slot(outbox: str, *, using: str | None = None) -> slots.SlotState:
    """Drop a logical outbox's replication slot (it then keeps no WAL): refused while a relay
    holds the outbox (ReplicationSlotInUse). Messages the slot held and the relay had not
    published are lost with it. The outbox need not be declared any more. Returns the slot's
    state just before; the relay creates a new slot at its next start."""
    found = slots.drop_unless_relayed(outbox, using=using or conf.get().DATABASE)
    logger.warning(
        "pgmsg: dropped replication slot %r of outbox %r (wal_status %s, confirmed up to %s)",
        found.slot,
        outbox,
        found.wal_status,
        found.confirmed_flush_lsn,
    )
    return found
