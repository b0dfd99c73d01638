"""manage.py pgmsg_partitions: create the partitions pgmsg needs ahead, and list them.

Workers do the same by themselves (docs/storage.md); this is for a deploy step or a cron job
where no worker runs.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from pgmsg import storage


class Command(BaseCommand):
    help = "Create pgmsg's partitions ahead of time (workers also do), then list them."

    def add_arguments(self, parser):
        parser.add_argument(
            "--list", action="store_true", help="only list the partitions, create nothing"
        )

    def handle(self, *args, **options):
        if not options["list"]:
            for name in storage.ensure_partitions():
                self.stdout.write(self.style.SUCCESS(f"created {name}"))
        for table, partition in storage.partition_list():
            bounds = (
                "DEFAULT" if partition.is_default else f"[{partition.lower}, {partition.upper})"
            )
            self.stdout.write(f"{table}  {partition.name}  {bounds}")
