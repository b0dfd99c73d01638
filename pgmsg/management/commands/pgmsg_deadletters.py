"""manage.py pgmsg_deadletters list|replay|discard: operate on dead notifications."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from pgmsg import deadletter


class Command(BaseCommand):
    help = "List, replay or discard dead notifications (by id, or all of a channel)."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["list", "replay", "discard"])
        parser.add_argument("ids", nargs="*", type=int, help="notification ids")
        parser.add_argument("--channel", help="every dead notification of this channel")

    def handle(self, *args, action, ids, channel, **options):
        if action == "list":
            rows = deadletter.dead_letters(channel)
            if ids:
                rows = rows.filter(id__in=ids)
            for row in rows:
                error = (row.last_error.strip().splitlines() or [""])[-1]
                self.stdout.write(f"{row.id}\t{row.channel}\tattempts={row.attempts}\t{error}")
            return
        if not ids and not channel:
            raise CommandError(f"{action}: give notification ids or --channel NAME")
        func = deadletter.replay if action == "replay" else deadletter.discard
        count = func(ids or None, channel=channel)
        self.stdout.write(self.style.SUCCESS(f"{action}: {count} notification(s)"))
