"""manage.py pgmsg_inbox status|list|replay|discard|stats|gaps|purge: operate the inboxes.

The verbs are those of pgmsg_deadletters and pgmsg_subscriptions (docs/operations.md);
``health`` is ``status`` under its first name. Each maps onto pgmsg.inbox.operations.
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from pgmsg.core import errors
from pgmsg.inbox import operations as inbox_ops
from pgmsg.inbox.bridges import health as bridge_health


class Command(BaseCommand):
    help = (
        "Inbox status (health; exits 1 when an inbox is degraded), messages by state, replay, "
        "discard, per-type statistics, gap check and retention."
    )

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        for verb in ("status", "health"):
            health = sub.add_parser(
                verb,
                help="pending, dead, oldest age, throughput, healthy or degraded (exit status 1)",
            )
            health.add_argument("inboxes", nargs="*", help="default: every declared inbox")
            health.add_argument("--json", action="store_true", help="JSON instead of text")
        listing = sub.add_parser("list", help="messages in a state (default: the dead letters)")
        listing.add_argument("inbox", nargs="?", help="default: every inbox")
        listing.add_argument("--state", default="dead", choices=inbox_ops.STATES)
        listing.add_argument("--limit", type=int, default=100, help="at most this many (100)")
        stats = sub.add_parser("stats", help="counts per message type")
        stats.add_argument("inbox")
        gaps = sub.add_parser("gaps", help="ordered aggregates held back by a failed head")
        gaps.add_argument("inbox")
        gaps.add_argument("--json", action="store_true")
        for name, text in (
            ("replay", "make dead (or retrying) messages due now"),
            ("discard", "settle dead or pending messages without handling"),
        ):
            action = sub.add_parser(name, help=text)
            action.add_argument("inbox")
            action.add_argument("ids", nargs="*", type=int, help="message row ids")
            action.add_argument("--type", help="every such message of this type")
            if name == "discard":
                action.add_argument("--reason", required=True, help="kept with the messages")
        purge = sub.add_parser("purge", help="delete per PGMSG INBOX_RETENTION settings")
        purge.add_argument("inboxes", nargs="*", help="default: every declared inbox")

    def handle(self, *args, action, **options):
        try:
            getattr(self, f"_{action}")(**options)
        except errors.PgmsgError as exc:
            raise CommandError(str(exc))

    def _status(self, **options):
        self._health(**options)

    def _health(self, inboxes, json, **options):
        rows = inbox_ops.health(inboxes or None)
        names = {h.inbox for h in rows}
        bridges = [b for b in bridge_health.health() if not inboxes or b.inbox in names]
        if json:
            self._health_json(rows, bridges)
        else:
            for h in rows:
                self.stdout.write(self._inbox_line(h))
            for b in bridges:
                self.stdout.write(self._bridge_line(b))
        self._exit_if_degraded(rows, bridges)

    def _health_json(self, rows, bridges) -> None:
        degraded = any(h.status == inbox_ops.DEGRADED for h in [*rows, *bridges])
        body = {
            "status": inbox_ops.DEGRADED if degraded else inbox_ops.HEALTHY,
            "inboxes": {h.inbox: h.as_dict() for h in rows},
        }
        if bridges:
            body["bridges"] = {b.bridge: b.as_dict() for b in bridges}
        self.stdout.write(_json(body))

    def _inbox_line(self, h) -> str:
        style = self.style.ERROR if h.status == inbox_ops.DEGRADED else self.style.SUCCESS
        return (
            f"{h.inbox}\t{style(h.status)}\tpending={h.pending}\tdead={h.dead}\t"
            f"oldest={h.oldest_pending_age:.1f}s\tprocessed/min={h.processed_last_minute}"
            + (f"\t({'; '.join(h.reasons)})" if h.reasons else "")
        )

    def _bridge_line(self, b) -> str:
        style = self.style.ERROR if b.status == inbox_ops.DEGRADED else self.style.SUCCESS
        last = b.last_message_at.isoformat() if b.last_message_at else "never"
        return (
            f"bridge {b.bridge} -> {b.inbox}\t{style(b.status)}\t"
            f"{'connected' if b.connected else 'not connected'}\tlast message={last}\t"
            f"lag={'?' if b.lag is None else b.lag}"
            + (f"\t({'; '.join(b.reasons)})" if b.reasons else "")
        )

    def _exit_if_degraded(self, rows, bridges=()) -> None:
        # A monitor calling the command sees failure, as the HTTP endpoint answers 503.
        degraded = [h.inbox for h in rows if h.status == inbox_ops.DEGRADED]
        degraded += [f"bridge {b.bridge}" for b in bridges if b.status == inbox_ops.DEGRADED]
        if degraded:
            raise CommandError(f"degraded: {', '.join(degraded)}", returncode=1)

    def _list(self, inbox, state, limit, **options):
        rows = list(inbox_ops.messages(inbox, state=state)[:limit])
        for row in rows:
            error = (row.last_error.strip().splitlines() or [""])[-1]
            self.stdout.write(
                f"{row.id}\t{row.inbox}\t{row.message_id}\t{row.type}\t{row.state}\t"
                f"attempts={row.attempts}\t{error}"
            )
        if not rows:
            self.stdout.write(f"no {state} messages")

    def _stats(self, inbox, **options):
        self.stdout.write("type\treceived\tprocessed\tpending\tdead\tdiscarded")
        for s in inbox_ops.stats(inbox):
            self.stdout.write(
                f"{s.type}\t{s.received}\t{s.processed}\t{s.pending}\t{s.dead}\t{s.discarded}"
            )

    def _gaps(self, inbox, json, **options):
        found = inbox_ops.gaps(inbox)
        if json:
            self.stdout.write(_json([g.as_dict() for g in found]))
            return
        for g in found:
            error = (g.last_error.strip().splitlines() or [""])[-1]
            self.stdout.write(
                f"{g.aggregate_id}\thead={g.head_id} ({g.type}, {g.status}, "
                f"attempts={g.attempts})\twaiting={g.waiting}\t{error}"
            )
        if not found:
            self.stdout.write("no aggregate is held back")

    def _replay(self, inbox, ids, type, **options):
        count = inbox_ops.replay(inbox, ids or None, type=type)
        self.stdout.write(self.style.SUCCESS(f"replayed {count} message(s)"))

    def _discard(self, inbox, ids, type, reason, **options):
        count = inbox_ops.discard(inbox, ids or None, type=type, reason=reason)
        self.stdout.write(self.style.SUCCESS(f"discarded {count} message(s)"))

    def _purge(self, inboxes, **options):
        deleted = inbox_ops.purge(inboxes or None)
        self.stdout.write(
            self.style.SUCCESS(
                f"deleted {deleted['processed']} processed and {deleted['dead']} dead or discarded "
                "message(s)"
            )
        )


def _json(data) -> str:
    return json.dumps(data, indent=2, sort_keys=True)
