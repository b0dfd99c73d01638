"""manage.py pgmsg_subscriptions status|list|reset|skip|retry: operate event subscriptions.

The verbs are those of pgmsg_deadletters and pgmsg_inbox (docs/operations.md); each maps
onto pgmsg.events.subscription_operations.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from pgmsg.core import errors
from pgmsg.events import reads
from pgmsg.events import subscription_operations as subscriptions


class Command(BaseCommand):
    help = (
        "Show subscription partitions (state, lag behind the head, last handled event, last "
        "error); list the stopped or retrying ones; reset a subscription to replay; skip or "
        "retry the failed event of stopped partitions."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["status", "list", "reset", "skip", "retry"])
        parser.add_argument("subscription", nargs="?", help="subscription name")
        parser.add_argument(
            "--partition",
            type=int,
            action="append",
            dest="partitions",
            help="only this partition (repeatable; default: all)",
        )
        parser.add_argument(
            "--to",
            default="beginning",
            help="reset to: beginning (default), end, archive (just after the last archived "
            "event), or an event position",
        )

    def handle(self, *args, action, subscription, partitions, to, **options):
        if action in ("status", "list"):
            getattr(self, f"_{action}")(subscription)
            return
        if not subscription:
            raise CommandError(f"{action}: name the subscription")
        try:
            if action == "reset":
                count = subscriptions.reset(
                    subscription, to=_reset_point(to), partitions=partitions
                )
            else:
                func = subscriptions.skip if action == "skip" else subscriptions.retry
                count = func(subscription, partitions)
        except errors.PgmsgError as exc:
            raise CommandError(str(exc))
        self.stdout.write(self.style.SUCCESS(f"{action} {subscription}: {count} partition(s)"))

    def _status(self, name: str | None) -> None:
        rows = subscriptions.status(name)
        if not rows:
            self.stdout.write(
                "no subscription partitions stored yet (they appear when a "
                "worker first serves the subscription)"
            )
        for row in rows:
            lag = subscriptions.lag(row)
            if lag is None:
                where = "behind=? (subscription not declared here)\tlast_handled=?"
            else:
                last = lag.last_handled_position
                where = f"behind={lag.behind_text}\tlast_handled={'-' if last is None else last}"
            self._write(row, f"{where}\thandled={row.handled}\tattempts={row.attempts}")
        for blocker in reads.horizon_blockers():
            self.stdout.write(
                self.style.WARNING(f"read horizon held back by {blocker.describe(with_query=True)}")
            )

    def _list(self, name: str | None) -> None:
        rows = subscriptions.failing(name)
        for row in rows:
            self._write(row, f"attempts={row.attempts}")
        if not rows:
            self.stdout.write("no partition is stopped or retrying")

    def _write(self, row, middle: str) -> None:
        line = f"{row.subscription}\t{row.partition}\t{row.state}\t{middle}"
        if row.failed_position is not None:
            error = (row.last_error.strip().splitlines() or [""])[-1]
            line += f"\tfailed_position={row.failed_position}\t{error}"
            line = self.style.ERROR(line) if row.state == "stopped" else line
        self.stdout.write(line)


def _reset_point(text: str):
    if text in ("beginning", "end", "archive"):
        return text
    try:
        return int(text)
    except ValueError:
        raise CommandError(f"--to must be beginning, end, archive or a position, got {text!r}")
