"""manage.py pgmsg_outbox list|status|replay|discard|drop-slot: operate the outboxes.

The verbs are those of pgmsg_deadletters, pgmsg_inbox and pgmsg_subscriptions
(docs/operations.md); each maps onto pgmsg.outbox.operations.
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from pgmsg.core import conf, errors
from pgmsg.outbox import operations as outbox_ops
from pgmsg.outbox import slots

#: What a discard logs with the ids (the rows are deleted) without --reason.
DEFAULT_REASON = "discarded with manage.py pgmsg_outbox"


class Command(BaseCommand):
    help = (
        "Outbox status (exits 1 when an outbox is degraded) and dead letters: list, replay, "
        "discard (by message row id, or all of --outbox NAME)."
    )

    def add_arguments(self, parser):
        sub = parser.add_subparsers(
            dest="action", required=True, metavar="{list,status,replay,discard,drop-slot}"
        )
        for verb, text in (
            ("list", "show dead messages (all, or those named)"),
            ("replay", "make dead (or retrying) messages due now with a fresh attempt count"),
            ("discard", "delete messages for good, unpublished; their keys move on"),
        ):
            action = sub.add_parser(verb, help=text)
            action.add_argument("ids", nargs="*", type=int, help="outbox message row ids")
            action.add_argument("--outbox", help="every dead message of this outbox")
            if verb == "discard":
                action.add_argument(
                    "--reason",
                    default="",
                    help=f"logged with the ids (default: {DEFAULT_REASON!r})",
                )
        for verb in ("status", "health"):
            status = sub.add_parser(
                verb,
                help="backlog, lag, dead letters, relays; healthy or degraded (exit status 1)",
            )
            status.add_argument("--outbox", help="only this outbox")
            status.add_argument("--json", action="store_true", help="JSON instead of text")

        drop = sub.add_parser(
            "drop-slot",
            help="drop a logical outbox's replication slot (refused while a relay holds it); "
            "its unrelayed messages are lost with it",
        )
        drop.add_argument("name", help="the outbox (need not be declared any more)")
        drop.add_argument("--yes", action="store_true", help="drop it: without, only show")

    def handle(self, *args, action, **options):
        try:
            if action == "drop-slot":
                self._drop_slot(**options)
            elif action in ("status", "health"):
                self._status(**options)
            else:
                getattr(self, f"_{action}")(**options)
        except errors.PgmsgError as exc:
            raise CommandError(str(exc))

    def _list(self, ids, outbox, **options):
        rows = outbox_ops.dead_letters(outbox)
        for row in rows.filter(id__in=ids) if ids else rows:
            error = (row.last_error.strip().splitlines() or [""])[-1]
            self.stdout.write(
                f"{row.id}\t{row.outbox}\t{row.message_id}\t{row.type}\t"
                f"key={row.key or ''}\tattempts={row.attempts}\t{error}"
            )

    def _replay(self, ids, outbox, **options):
        _need_selection("replay", ids, outbox)
        _refuse_missing("replay", ids)
        count = outbox_ops.replay(ids or None, outbox=outbox)
        self.stdout.write(self.style.SUCCESS(f"replay: {count} message(s)"))

    def _discard(self, ids, outbox, reason, **options):
        _need_selection("discard", ids, outbox)
        _refuse_missing("discard", ids)
        # As the admin adds its user: where the discard came from.
        reason = f"{reason.strip()} ({DEFAULT_REASON})" if reason.strip() else DEFAULT_REASON
        count = outbox_ops.discard(ids or None, outbox=outbox, reason=reason)
        self.stdout.write(self.style.SUCCESS(f"discard: {count} message(s)"))

    def _status(self, outbox, json, **options):
        rows = outbox_ops.health([outbox] if outbox else None)
        degraded = [h.outbox for h in rows if h.status == outbox_ops.DEGRADED]
        if json:
            data = {
                "status": outbox_ops.DEGRADED if degraded else outbox_ops.HEALTHY,
                "outboxes": {h.outbox: h.as_dict() for h in rows},
            }
            self.stdout.write(_json(data))
        elif not rows:
            self.stdout.write(
                "no outbox is declared: declare one with pgmsg.Outbox(...) in a module your "
                "apps import (docs/outbox.md)"
            )
        else:
            for h in rows:
                style = self.style.ERROR if h.status == outbox_ops.DEGRADED else self.style.SUCCESS
                self.stdout.write(
                    f"{h.outbox}\t{style(h.status)}\tdestination={h.destination}\t"
                    f"pending={h.pending}\tdead={h.dead}\tlag={h.oldest_pending_age:.1f}s\t"
                    f"relayed={len(h.relayed_partitions)}/{h.partitions}"
                    + (_slot(h) if h.capture == "logical" else "")
                    + (f"\t({'; '.join(h.reasons)})" if h.reasons else "")
                )
        if degraded:
            raise CommandError(f"degraded: {', '.join(degraded)}", returncode=1)

    def _drop_slot(self, name, yes, **options):
        found = slots.state(name, using=conf.get().DATABASE)
        if found is None:
            raise CommandError(f"outbox {name!r} has no replication slot in this database")
        self.stdout.write(
            f"slot {found.slot} of outbox {name}: wal_status={found.wal_status} "
            f"confirmed_flush_lsn={found.confirmed_flush_lsn} lag={found.lag_bytes}B"
        )
        if found.lost:
            self.stdout.write(
                self.style.WARNING(
                    "the slot was invalidated: messages of transactions committed after "
                    f"{found.confirmed_flush_lsn} that the relay had not published are lost; "
                    "they were only in the removed WAL, so pgmsg cannot list them: find them "
                    "in your own records"
                )
            )
        else:  # refused, naming it, while a relay holds the outbox
            unrelayed = outbox_ops.unrelayed_messages(name)
            self.stdout.write(f"{len(unrelayed)} unrelayed message(s) would be lost with it")
            for e in unrelayed:
                self.stdout.write(f"{e.message_id}\t{e.type}\tkey={e.key or ''}\t{e.created_at}")
        if not yes:
            raise CommandError("nothing dropped: add --yes to drop the slot")
        outbox_ops.drop_slot(name)
        self.stdout.write(
            self.style.SUCCESS(
                f"dropped slot {found.slot}; the relay creates a new one when it starts, and "
                "publish() raises ReplicationSlotMissing until then"
            )
        )


def _slot(h) -> str:
    if h.slot is None:
        return "\tslot=none"
    age = "unknown" if h.slot_age is None else f"{h.slot_age:.1f}s"
    lost = "\tslot=LOST" if h.slot_wal_status == "lost" else ""
    return f"\tslot_lag={h.slot_lag_bytes}B\tslot_age={age}{lost}"


def _refuse_missing(action: str, ids: list[int]) -> None:
    """Ids that match nothing are a bad selection: say which, do nothing (exit status 1)."""
    missing = outbox_ops.missing(ids, action=action) if ids else []
    if missing:
        states = "dead or retrying" if action == "replay" else "dead or pending"
        raise CommandError(
            f"{action}: no {states} outbox message has id(s) "
            f"{', '.join(map(str, missing))}; nothing done"
        )


def _need_selection(verb: str, ids, outbox) -> None:
    if not ids and not outbox:
        raise CommandError(f"{verb}: give outbox message ids or --outbox NAME")


def _json(data) -> str:
    return json.dumps(data, indent=2, sort_keys=True)
