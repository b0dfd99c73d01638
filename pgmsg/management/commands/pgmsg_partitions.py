"""manage.py pgmsg_partitions: create the partitions pgmsg needs ahead, drop the outbox's
emptied past weeks, and list them.

Workers do the same by themselves (docs/storage.md); this is for a deploy step or a cron job
where no worker runs.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from pgmsg import storage


class Command(BaseCommand):
    help = (
        "Create pgmsg's partitions ahead of time and drop the outbox's emptied past weeks "
        "(workers also do), then list them."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--list", action="store_true", help="only list the partitions, create or drop nothing"
        )

    def handle(self, *args, **options):
        if not options["list"]:
            for name in storage.ensure_partitions():
                self.stdout.write(self.style.SUCCESS(f"created {name}"))
            for name in storage.drop_emptied():
                self.stdout.write(self.style.SUCCESS(f"dropped {name}"))
            for name in storage.seal_partitions():
                self.stdout.write(self.style.SUCCESS(f"sealed {name}"))
        for table, partition in storage.partition_list():
            bounds = (
                "DEFAULT" if partition.is_default else f"[{partition.lower}, {partition.upper})"
            )
            self.stdout.write(f"{table}  {partition.name}  {bounds}")
