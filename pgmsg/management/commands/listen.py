"""manage.py listen: run pgmsg workers (maps arguments onto pgmsg.worker and supervisor)."""

from __future__ import annotations

import logging

from django.core.management.base import BaseCommand, CommandError

from pgmsg import errors
from pgmsg.supervisor import Supervisor
from pgmsg.worker import Worker


class Command(BaseCommand):
    help = "Handle pgmsg messages: LISTEN, claim with SKIP LOCKED, run listeners exactly once."

    def add_arguments(self, parser):
        parser.add_argument("channels", nargs="*", help="channels to serve (default: all)")
        parser.add_argument(
            "--processes",
            type=int,
            default=1,
            help="worker processes under one supervisor (default 1)",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=None,
            help="messages claimed per transaction (default PGMSG BATCH_SIZE)",
        )
        parser.add_argument(
            "--inbox",
            action="append",
            dest="inboxes",
            default=None,
            help="serve this inbox (repeatable); naming any thing serves only what is named",
        )
        parser.add_argument(
            "--subscription",
            action="append",
            dest="subscriptions",
            default=None,
            help="serve this event subscription (repeatable)",
        )
        parser.add_argument(
            "--partition",
            default=None,
            metavar="i/N",
            help="take only share i of N of ordered inbox aggregates (0 <= i < N)",
        )
        parser.add_argument(
            "--until-idle",
            action="store_true",
            help="handle what is due, then exit (for cron jobs and tests)",
        )

    def handle(
        self,
        *args,
        channels,
        processes,
        batch_size,
        until_idle,
        inboxes,
        subscriptions,
        partition,
        **options,
    ):
        if processes < 1:
            raise CommandError(f"--processes must be at least 1, got {processes}")
        if batch_size is not None and batch_size < 1:
            raise CommandError(f"--batch-size must be at least 1, got {batch_size}")
        if (
            options["verbosity"] >= 1
            and not logging.getLogger("pgmsg").handlers
            and not logging.getLogger().handlers
        ):
            logging.basicConfig(
                level=logging.INFO if options["verbosity"] >= 2 else logging.WARNING,
                format="%(asctime)s %(levelname)s %(message)s",
            )

        share = _parse_partition(partition) if partition else None

        def make_worker() -> Worker:
            return Worker(
                channel_names=channels or None,
                inboxes=inboxes,
                subscriptions=subscriptions,
                partition=share,
                batch_size=batch_size,
                until_idle=until_idle,
            )

        try:
            make_worker()  # fail fast, in the parent, on bad channel names or no listeners
        except errors.PgmsgError as exc:
            raise CommandError(str(exc))
        if processes == 1:
            make_worker().run()
            return

        def run_child() -> int:
            make_worker().run()
            return 0

        Supervisor(processes, run_child).run()


def _parse_partition(text: str) -> tuple[int, int]:
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise CommandError(f"--partition must look like i/N (e.g. 0/4), got {text!r}")
    if not 0 <= index < count:
        raise CommandError(f"--partition {text!r}: need 0 <= i < N")
    return index, count
