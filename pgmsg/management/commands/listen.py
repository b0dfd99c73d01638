"""manage.py listen: run pgmsg workers (maps arguments onto pgmsg.worker and supervisor).

At verbosity 1 it prints one line when it starts (what it serves, in how many processes) and
one when it stops; nothing per message. Listener code is imported once, at start: a change
needs a restart, or ``--autoreload`` in development.
"""

from __future__ import annotations

import logging
import os

from django.core.management.base import BaseCommand, CommandError

from pgmsg.channels import declarations as channels
from pgmsg.core import conf, errors, run_modes, schema, signals
from pgmsg.core.worker import Worker
from pgmsg.metrics import exporter


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
            "--outbox",
            action="append",
            dest="outboxes",
            default=None,
            help="relay this outbox to its broker (repeatable)",
        )
        parser.add_argument(
            "--bridge",
            action="append",
            dest="bridges",
            default=None,
            help="run this bridge from a broker into its inbox (repeatable; PGMSG INBOX_BRIDGES)",
        )
        parser.add_argument(
            "--partition",
            default=None,
            metavar="i/N",
            help="take only share i of N of ordered inbox aggregates and outbox partitions",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=None,
            help="serve Prometheus metrics of every worker process on this port (pgmsg[metrics])",
        )
        parser.add_argument(
            "--metrics-address",
            default="0.0.0.0",
            help="address the metrics endpoint listens on (default 0.0.0.0)",
        )
        parser.add_argument(
            "--until-idle",
            action="store_true",
            help="handle what is due, then exit (for cron jobs and tests)",
        )
        parser.add_argument(
            "--autoreload",
            action="store_true",
            help="development: restart when a Python file changes (one process; Django's "
            "autoreloader). Without it, a listener change needs a restart of listen.",
        )

    def handle(
        self,
        *args,
        channels,
        processes,
        batch_size,
        until_idle,
        autoreload: bool = False,
        inboxes,
        subscriptions,
        outboxes,
        bridges=None,
        partition,
        metrics_port,
        metrics_address,
        **options,
    ):
        # First: a stop signal during the start-up below is a graceful stop, not exit 143.
        signals.catch_early()
        try:
            run_modes.check(processes=processes, autoreload=autoreload, until_idle=until_idle)
        except errors.PgmsgError as exc:
            raise CommandError(str(exc))
        if batch_size is not None and batch_size < 1:
            raise CommandError(f"--batch-size must be at least 1, got {batch_size}")
        _configure_logging(options["verbosity"])
        share = _parse_partition(partition) if partition else None

        def make_worker(**kwargs) -> Worker:
            return Worker(
                **kwargs,
                channel_names=channels or None,
                inboxes=inboxes,
                subscriptions=subscriptions,
                outboxes=outboxes,
                bridges=bridges,
                partition=share,
                batch_size=batch_size,
                until_idle=until_idle,
            )

        try:
            # Fail fast, in the parent, on bad channel names or no listeners.
            summary = describe(make_worker(), processes)
            # At once, not a worker retrying "relation does not exist" (--skip-checks too).
            _refuse_unmigrated()
            created = exporter.use_multiprocess_dir() if metrics_port is not None else None
        except errors.PgmsgError as exc:
            raise CommandError(str(exc))
        try:
            if metrics_port is not None:
                exporter.serve(metrics_port, metrics_address)
                self.stdout.write(f"pgmsg: metrics on http://{metrics_address}:{metrics_port}/")
            code = run_modes.run(
                make_worker,
                processes=processes,
                autoreload=autoreload,
                summary=summary,
                say=self.stdout.write if options["verbosity"] >= 1 else None,
            )
            if code:
                raise CommandError(f"the worker exited with status {code}", returncode=code)
        finally:
            exporter.remove_multiprocess_dir(created)


def _configure_logging(verbosity: int) -> None:
    if verbosity < 1 or logging.getLogger("pgmsg").handlers or logging.getLogger().handlers:
        return
    level = logging.INFO if verbosity >= 2 else logging.WARNING
    # The handler's own level too: records of loggers Django configured (e.g. the
    # autoreloader's INFO lines) propagate here past the root logger's level, and
    # were printed twice.
    handler = logging.StreamHandler()
    handler.setLevel(level)
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(message)s", handlers=[handler]
    )


def _refuse_unmigrated() -> None:
    alias = conf.get().DATABASE
    missing = schema.unapplied(alias)
    if missing:
        raise errors.NotMigrated(f"{schema.describe(alias, missing)}: {schema.HINT}")


def describe(worker: Worker, processes: int) -> str:
    """One line: what ``worker`` serves (channels with their listener count, inboxes,
    subscriptions, and any other source by its label) and in how many processes."""
    parts = []
    channel_names = sorted(
        name
        for source in worker.sources
        if source.label in ("notifications", "broadcast")
        for name in source.names
    )
    if channel_names:
        listeners = sum(len(channels.registry.listeners.get(n, ())) for n in channel_names)
        parts.append(
            f"{len(channel_names)} channel(s) {', '.join(channel_names)} "
            f"({listeners} listener function(s))"
        )
    by_kind: dict[str, list[str]] = {}
    for source in worker.sources:
        if source.label in ("notifications", "broadcast"):
            continue
        kind, _, name = source.label.partition(":")
        by_kind.setdefault(kind, []).append(name or kind)
    plural = {
        "inbox": "inbox(es)",
        "subscription": "subscription(s)",
        "outbox": "outbox(es)",
        "bridge": "bridge(s)",
    }
    for kind, found in by_kind.items():
        parts.append(f"{len(found)} {plural.get(kind, kind)} {', '.join(sorted(found))}")
    return f"{'; '.join(parts)}; {processes} process(es), pid {os.getpid()}"


def _parse_partition(text: str) -> tuple[int, int]:
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise CommandError(f"--partition must look like i/N (e.g. 0/4), got {text!r}")
    if not 0 <= index < count:
        raise CommandError(f"--partition {text!r}: need 0 <= i < N")
    return index, count
