"""manage.py pgmsg_subscriptions status|reset|skip|retry: operate event subscriptions."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from pgmsg import errors, subscriptions


class Command(BaseCommand):
    help = (
        "Show subscription partitions (checkpoint, state, last error); reset a subscription "
        "to replay; skip or retry the failed event of stopped partitions."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["status", "reset", "skip", "retry"])
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
            help="reset to: beginning (default), end, or an event position",
        )

    def handle(self, *args, action, subscription, partitions, to, **options):
        if action == "status":
            self._status(subscription)
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
            line = (
                f"{row.subscription}\t{row.partition}\t{row.state}\t"
                # The checkpoint is (transaction id, position): a position of 0 after a
                # transaction id means "everything before that transaction".
                f"checkpoint={row.checkpoint_position}\t"
                f"checkpoint_transaction={row.checkpoint_transaction}\thandled={row.handled}\t"
                f"attempts={row.attempts}"
            )
            if row.failed_position is not None:
                error = (row.last_error.strip().splitlines() or [""])[-1]
                line += f"\tfailed_position={row.failed_position}\t{error}"
                line = self.style.ERROR(line) if row.state == "stopped" else line
            self.stdout.write(line)


def _reset_point(text: str):
    if text in ("beginning", "end"):
        return text
    try:
        return int(text)
    except ValueError:
        raise CommandError(f"--to must be beginning, end or a position, got {text!r}")
