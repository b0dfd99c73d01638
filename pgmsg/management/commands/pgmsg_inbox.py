"""manage.py pgmsg_inbox health|stats|gaps|replay|discard|purge: operate the inboxes."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from pgmsg import errors, inbox_ops


class Command(BaseCommand):
    help = "Inbox health, per-type statistics, gap check, replay, discard and retention."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        health = sub.add_parser("health", help="pending, dead, oldest age, throughput, status")
        health.add_argument("inboxes", nargs="*", help="default: every declared inbox")
        health.add_argument("--json", action="store_true", help="JSON instead of text")
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

    def _health(self, inboxes, json, **options):
        rows = inbox_ops.health(inboxes or None)
        degraded = any(h.status == inbox_ops.DEGRADED for h in rows)
        if json:
            self.stdout.write(
                _json(
                    {
                        "status": inbox_ops.DEGRADED if degraded else inbox_ops.HEALTHY,
                        "inboxes": {h.inbox: h.as_dict() for h in rows},
                    }
                )
            )
            return
        for h in rows:
            style = self.style.ERROR if h.status == inbox_ops.DEGRADED else self.style.SUCCESS
            self.stdout.write(
                f"{h.inbox}\t{style(h.status)}\tpending={h.pending}\tdead={h.dead}\t"
                f"oldest={h.oldest_pending_age:.1f}s\tprocessed/min={h.processed_last_minute}"
                + (f"\t({'; '.join(h.reasons)})" if h.reasons else "")
            )

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
