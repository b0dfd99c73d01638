"""Periodic archiving (PGMSG ARCHIVE_INTERVAL): a worker starts pgmsg_archive in a child
process when an event partition is due, never in its own loop (docs/storage.md)."""

from __future__ import annotations

import datetime as dt
import logging
import os
import subprocess
import sys
import time

from django.utils import timezone

from pgmsg.core import conf

logger = logging.getLogger(__name__)


class PeriodicArchive:
    """One worker's timer: every ARCHIVE_INTERVAL seconds (from its first batch), when a
    partition is due and no child of this worker still runs, start ``pgmsg_archive
    --periodic``. The child takes the cluster's archive lock, so at most one run archives at a
    time however many workers start one; the others find the lock taken and end."""

    def __init__(self) -> None:
        self._next = 0.0
        self._child: subprocess.Popen | None = None

    @property
    def child(self) -> subprocess.Popen | None:
        """The run this worker started last (it may still run after the worker stops)."""
        return self._child

    def maybe_start(self) -> None:
        settings = conf.get()
        if not (settings.ARCHIVE_INTERVAL and settings.ARCHIVE_PATH):
            return
        if self._child is not None:
            code = self._child.poll()
            if code is None:
                return  # still running
            if code:
                logger.error("pgmsg: periodic pgmsg_archive ended with exit code %s", code)
            self._child = None
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + settings.ARCHIVE_INTERVAL
        # Imported here, once archiving is on: the archive needs the `spark` extra (pyspark),
        # which a worker that serves subscriptions must not need.
        from pgmsg.export import archive

        before = timezone.now() - dt.timedelta(seconds=settings.ARCHIVE_AFTER)
        if not archive.due(before):  # one catalog query: most passes end here
            return
        logger.info("pgmsg: starting a periodic pgmsg_archive (partitions before %s)", before)
        # The child is this program's interpreter with its settings and import path (Django
        # commands run with `python -m django` given DJANGO_SETTINGS_MODULE), and this
        # worker's view of the archive settings on its command line.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        command = [
            *(sys.executable, "-m", "django", "pgmsg_archive", "--periodic"),
            *("--before", before.isoformat(), "--output", settings.ARCHIVE_PATH),
            *("--master", settings.EXPORT_SPARK_MASTER),
        ]
        self._child = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
        )
