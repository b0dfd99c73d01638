"""manage.py pgmsg_archive [--before DATE] [--output PATH]: event partitions to Parquet, then
dropped (pgmsg/export/archive.py; docs/storage.md)."""

from __future__ import annotations

import datetime as dt

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from pgmsg.core import conf, errors
from pgmsg.management.spark_options import spark_extra


class Command(BaseCommand):
    help = (
        "Archive the event store's monthly partitions that end before a date: export each to "
        "Parquet, check the row count there, then drop it."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--before",
            help="a date (YYYY-MM-DD, UTC) or ISO time; default: now - PGMSG ARCHIVE_AFTER",
        )
        parser.add_argument("--output", help="where the datasets go; default: PGMSG ARCHIVE_PATH")
        parser.add_argument("--master", help="Spark master (default: EXPORT_SPARK_MASTER)")
        parser.add_argument(
            "--list", action="store_true", help="only list the partitions that would go"
        )
        parser.add_argument(
            "--periodic",
            action="store_true",
            help="as started by workers (PGMSG ARCHIVE_INTERVAL): another run holding the "
            "archive lock is not an error",
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help="archive partitions that a subscription has not passed yet (it then stops "
            "at the archived range)",
        )

    def handle(self, *args, **options):
        with spark_extra("pgmsg_archive"):
            from pgmsg.export import archive
        settings = conf.get()
        before = (
            _moment(options["before"])
            if options["before"]
            else (timezone.now() - dt.timedelta(seconds=settings.ARCHIVE_AFTER))
        )
        if options["list"]:
            for partition in archive.due(before):
                self.stdout.write(f"{partition.name}  [{partition.lower}, {partition.upper})")
            return
        output_path = options["output"] or settings.ARCHIVE_PATH
        if not output_path:
            raise CommandError("pgmsg_archive: give --output, or set PGMSG ARCHIVE_PATH")
        try:
            archive.archive(
                before,
                output_path,
                master=options["master"],
                echo=self.stdout.write,
                force=options["force"],
            )
        except errors.ArchiveRunning as exc:
            if not options["periodic"]:
                raise CommandError(str(exc)) from exc
            self.stdout.write(str(exc))
        except errors.ExportError as exc:
            raise CommandError(str(exc)) from exc


def _moment(text: str) -> dt.datetime:
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(f"--before: not a date or ISO time: {text!r}") from None
    return moment if timezone.is_aware(moment) else moment.replace(tzinfo=dt.UTC)
