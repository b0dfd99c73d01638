"""The export's choices and defaults that ``pgmsg_export --help`` shows: importable without
the ``spark`` extra (pyspark, pyarrow), which the modules that use them need."""

from __future__ import annotations

PARTITION_BY = ("day", "type", "category", "none")
MODES = ("append", "overwrite")
#: Seconds between micro-batches: a row waits at most this long before its batch starts, so
#: with batches of about a second (2,000 rows/s, bench/export.py) it stays seconds behind.
DEFAULT_TRIGGER_SECONDS = 1.0
#: Most rows per micro-batch by default: catching up a backlog commits files (and prints
#: progress) every million rows instead of once at the end of one huge batch.
DEFAULT_MAX_ROWS_PER_BATCH = 1_000_000
