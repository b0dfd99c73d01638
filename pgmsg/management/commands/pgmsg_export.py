"""manage.py pgmsg_export: export pgmsg's tables to Parquet datasets with Spark."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from pgmsg import errors, export


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(text)
    return key, value


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
            choices=sorted(export.registered()),
            help="default: every registered table that exists",
        )
        parser.add_argument(
            "--master", help="Spark master URL (default: PGMSG EXPORT_SPARK_MASTER, local[*])"
        )
        parser.add_argument(
            "--conf",
            action="append",
            type=_key_value,
            default=[],
            metavar="KEY=VALUE",
            help="Spark configuration, repeatable",
        )
        parser.add_argument(
            "--partitions",
            type=int,
            help="read partitions per table (default: one per EXPORT_ROWS_PER_PARTITION rows)",
        )
        parser.add_argument(
            "--partition-by",
            choices=export.PARTITION_BY,
            default="day",
            help="output partition column (default: the UTC day of each message's timestamp)",
        )
        parser.add_argument(
            "--mode",
            choices=export.MODES,
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
            "--dry-run",
            action="store_true",
            help="say what would be exported; write nothing, move no watermark",
        )

    def handle(self, *args, **options):
        try:
            summary = export.export_tables(
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
            self.stdout.write("dry run: nothing written, no watermark moved")
            return
        files = sum(r.files or 0 for r in summary.results)
        size = sum(r.bytes or 0 for r in summary.results)
        self.stdout.write(
            self.style.SUCCESS(
                f"exported {summary.rows} row(s) of {len(summary.results)} table(s): "
                f"{files} file(s), {size} byte(s) in {summary.seconds:.1f}s "
                f"(Spark start-up {summary.spark_seconds:.1f}s)"
            )
        )
