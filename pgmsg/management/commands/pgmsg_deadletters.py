"""manage.py pgmsg_deadletters list|status|replay|discard: dead letters of channels and inboxes.

The verbs are those of pgmsg_inbox and pgmsg_subscriptions (docs/operations.md); each maps
onto the capability's functions (pgmsg.channels.deadletters, pgmsg.inbox.operations).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from pgmsg.channels import deadletters as channel_deadletters
from pgmsg.core import errors
from pgmsg.inbox import operations as inbox_ops

#: What a discard records (kept with inbox messages, logged otherwise) without --reason.
DEFAULT_REASON = "discarded with manage.py pgmsg_deadletters"


class Command(BaseCommand):
    help = (
        "Dead letters of channels (notification ids) and inboxes (--inbox NAME, message row "
        "ids): list, status (counts), replay, discard."
    )

    def add_arguments(self, parser):
        sub = parser.add_subparsers(
            dest="action", required=True, metavar="{list,status,replay,discard}"
        )
        for verb, text in (
            ("list", "show dead letters (all, or those named)"),
            ("replay", "make dead letters due now with a fresh attempt count"),
            ("discard", "settle dead letters for good without handling them"),
        ):
            action = sub.add_parser(verb, help=text)
            action.add_argument(
                "ids", nargs="*", type=int, help="notification ids (message row ids with --inbox)"
            )
            where = action.add_mutually_exclusive_group()
            where.add_argument("--channel", help="the dead letters of this channel")
            where.add_argument("--inbox", help="the dead letters of this inbox")
            if verb == "discard":
                action.add_argument(
                    "--reason",
                    default="",
                    help="kept with inbox messages, logged for notifications "
                    f"(default: {DEFAULT_REASON!r})",
                )
        sub.add_parser("status", help="how many dead letters each channel and inbox holds")

    def handle(self, *args, action, **options):
        try:
            getattr(self, f"_{action}")(**options)
        except (errors.PgmsgError, ValueError) as exc:
            raise CommandError(str(exc))

    def _list(self, ids, channel, inbox, **options):
        shown = 0
        if inbox is None:
            rows = channel_deadletters.dead_letters(channel)
            for row in rows.filter(id__in=ids) if ids else rows:
                self.stdout.write(
                    f"{row.id}\t{row.channel}\tattempts={row.attempts}\t{_last_line(row)}"
                )
                shown += 1
        if channel is None and (inbox is not None or not ids):
            # Ids without --inbox are notification ids: inbox rows are listed only when named
            # by --inbox, or when nothing is named.
            rows = inbox_ops.dead_letters(inbox)
            for row in rows.filter(id__in=ids) if ids else rows:
                self.stdout.write(
                    f"{row.id}\tinbox {row.inbox}\t{row.message_id}\t{row.type}\t"
                    f"attempts={row.attempts}\t{_last_line(row)}"
                )
                shown += 1
        if not shown:
            self.stdout.write("no dead letters")

    def _status(self, **options):
        channels = channel_deadletters.status()
        inboxes = inbox_ops.dead_letter_counts()
        for name, count in channels.items():
            self.stdout.write(f"channel {name}\tdead={count}")
        for name, count in inboxes.items():
            self.stdout.write(f"inbox {name}\tdead={count}")
        if not channels and not inboxes:
            self.stdout.write("no dead letters")

    def _replay(self, ids, channel, inbox, **options):
        _refuse_missing("replay", ids, inbox)
        if inbox is not None:
            selected = ids or _all_dead(inbox)
            count = inbox_ops.replay(inbox, selected) if selected else 0
            self.stdout.write(self.style.SUCCESS(f"replay: {count} message(s) of inbox {inbox}"))
            return
        _need_selection("replay", ids, channel)
        count = channel_deadletters.replay(ids or None, channel=channel)
        self.stdout.write(self.style.SUCCESS(f"replay: {count} notification(s)"))

    def _discard(self, ids, channel, inbox, reason, **options):
        _refuse_missing("discard", ids, inbox)
        # As the admin adds its user: where the discard came from.
        reason = f"{reason.strip()} ({DEFAULT_REASON})" if reason.strip() else DEFAULT_REASON
        if inbox is not None:
            selected = ids or _all_dead(inbox)
            count = inbox_ops.discard(inbox, selected, reason=reason) if selected else 0
            self.stdout.write(self.style.SUCCESS(f"discard: {count} message(s) of inbox {inbox}"))
            return
        _need_selection("discard", ids, channel)
        count = channel_deadletters.discard(ids or None, channel=channel, reason=reason)
        self.stdout.write(self.style.SUCCESS(f"discard: {count} notification(s)"))


def _refuse_missing(action: str, ids: list[int], inbox: str | None) -> None:
    """Ids that match nothing are a bad selection: say which, do nothing (exit status 1)."""
    if not ids:
        return
    if inbox is None:
        missing = channel_deadletters.missing(ids, action=action)
        what = "dead notification" if action == "discard" else "dead or retrying notification"
    else:
        missing = inbox_ops.missing(inbox, ids, action=action)
        states = "dead or retrying" if action == "replay" else "dead or pending"
        what = f"{states} message of inbox {inbox}"
    if not missing:
        return
    hints = [
        f"id {row} is a message of inbox {name}: add --inbox {name}"
        for row, name in sorted(inbox_ops.inboxes_of(missing).items())
        if name != inbox
    ]
    raise CommandError(
        f"{action}: no {what} has id(s) {', '.join(map(str, missing))}; nothing done"
        + "".join(f"\n{hint}" for hint in hints)
    )


def _need_selection(action: str, ids: list[int], channel: str | None) -> None:
    if not ids and not channel:
        raise CommandError(
            f"{action}: give notification ids, --channel NAME or --inbox NAME (see the list action)"
        )


def _all_dead(inbox: str) -> list[int]:
    return list(inbox_ops.dead_letters(inbox).values_list("id", flat=True))


def _last_line(row) -> str:
    return (row.last_error.strip().splitlines() or [""])[-1]
