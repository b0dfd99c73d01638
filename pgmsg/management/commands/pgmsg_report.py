"""manage.py pgmsg_report: a Spark job over the exported Parquet, written as one HTML file."""

from __future__ import annotations

import datetime as dt

from django.core.management.base import BaseCommand, CommandError

from pgmsg.core import conf, errors
from pgmsg.management import spark_options


class Command(BaseCommand):
    help = (
        "Report on the Parquet lake written by pgmsg_export (messages per day and type, "
        "dead-letter rates, processing delays, busiest streams) as a self-contained HTML file."
    )

    def add_arguments(self, parser):
        parser.add_argument("--lake", required=True, help="the --output of pgmsg_export")
        parser.add_argument(
            "--since", type=dt.date.fromisoformat, help="only messages from this day (YYYY-MM-DD)"
        )
        parser.add_argument("--output", default="pgmsg-report.html", help="the HTML file to write")
        spark_options.add_spark_options(parser)

    def handle(self, *args, **options):
        with spark_options.spark_extra("pgmsg_report"):
            from pgmsg.export import report
        try:
            result = report.write(
                options["lake"],
                options["output"],
                since=options["since"],
                master=options["master"] or conf.get().EXPORT_SPARK_MASTER,
                spark_conf=dict(options["conf"]),
            )
        except errors.ExportError as exc:
            raise CommandError(str(exc))
        messages = sum(result.per_day.values())
        self.stdout.write(
            self.style.SUCCESS(
                f"wrote {options['output']}: {messages} message(s) in {', '.join(result.datasets)}"
            )
        )
