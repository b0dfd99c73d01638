"""manage.py pgmsg_export: export pgmsg's tables to Parquet datasets with Spark."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from pgmsg.core import errors
from pgmsg.export import choices, tables
from pgmsg.management import spark_options


class Command(BaseCommand):
    help = (
        "Export pgmsg's tables to Parquet (one dataset per table under --output), "
        "incrementally from each table's watermark unless --full."
    )

    def add_arguments(self, parser):
        parser.add_argument("--output", required=True, help="directory or URL (file:, hdfs:, s3a:)")
        parser.add_argument(
            "--tables",
            nargs="+",
            metavar="TABLE",
            help=f"any of {', '.join(sorted(tables.registered()))} (default: each that exists)",
        )
        spark_options.add_spark_options(parser)
        parser.add_argument(
            "--partitions",
            type=int,
            help="read partitions per table (default: one per EXPORT_ROWS_PER_PARTITION rows)",
        )
        parser.add_argument(
            "--partition-by",
            choices=choices.PARTITION_BY,
            default="day",
            help="output partition column (default: the UTC day of each message's timestamp)",
        )
        parser.add_argument(
            "--mode",
            choices=choices.MODES,
            help="default: append, overwrite for snapshot tables and --full",
        )
        parser.add_argument("--full", action="store_true", help="re-export from the beginning")
        parser.add_argument(
            "--flatten",
            default="",
            help="comma-separated top-level payload fields to copy into columns",
        )
        parser.add_argument(
            "--database-url",
            help="how executors reach PostgreSQL (default: the Django database's settings)",
        )
        parser.add_argument(
            "--follow",
            action="store_true",
            help="keep exporting new rows with Spark Structured Streaming until stopped "
            "(SIGTERM or Ctrl-C); needs --checkpoint",
        )
        parser.add_argument(
            "--checkpoint",
            help="--follow: Spark's checkpoint directory (offsets and commits), one per output",
        )
        parser.add_argument(
            "--trigger-interval",
            type=float,
            default=choices.DEFAULT_TRIGGER_SECONDS,
            metavar="SECONDS",
            help="--follow: seconds between micro-batches (default %(default)g)",
        )
        parser.add_argument(
            "--max-rows-per-batch",
            type=int,
            default=choices.DEFAULT_MAX_ROWS_PER_BATCH,
            help="--follow: most rows one micro-batch reads per table (default %(default)s)",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="say what would be exported; write nothing, move no watermark",
        )

    def handle(self, *args, **options):
        if options["follow"]:
            return self.follow(options)
        with spark_options.spark_extra("pgmsg_export"):
            from pgmsg.export import run
        try:
            summary = run.export_tables(
                options["output"],
                tables=options["tables"],
                master=options["master"],
                spark_conf=dict(options["conf"]),
                partitions=options["partitions"],
                partition_by=options["partition_by"],
                mode=options["mode"],
                full=options["full"],
                flatten=options["flatten"].split(","),
                dry_run=options["dry_run"],
                database_url=options["database_url"],
                echo=self.stdout.write,
            )
        except errors.ExportError as exc:
            raise CommandError(str(exc))
        if summary.dry_run:
            self.stdout.write(summary.describe())
        else:
            self.stdout.write(self.style.SUCCESS(summary.describe()))

    def follow(self, options):
        if not options["checkpoint"]:
            raise CommandError("--follow needs --checkpoint DIR (where Spark keeps its offsets)")
        if options["dry_run"] or options["full"] or options["mode"] or options["partitions"]:
            raise CommandError(
                "--follow appends every new row: --dry-run, --full, --mode and --partitions "
                "apply to batch runs only"
            )
        with spark_options.spark_extra("pgmsg_export"):
            from pgmsg.export import follow
        try:
            follow.follow(
                options["output"],
                checkpoint=options["checkpoint"],
                tables=options["tables"],
                master=options["master"],
                spark_conf=dict(options["conf"]),
                trigger_seconds=options["trigger_interval"],
                max_rows_per_batch=options["max_rows_per_batch"],
                partition_by=options["partition_by"],
                flatten=options["flatten"].split(","),
                database_url=options["database_url"],
                echo=self.stdout.write,
                install_signal_handlers=True,
            )
        except errors.ExportError as exc:
            raise CommandError(str(exc))
