"""The one summary table of `make bench`: each script records its headline lines here.

A bench script calls ``record()`` (or ``pairs()``) for the lines that matter; when the
environment names a file in PGMSG_BENCH_SUMMARY (bench/all.py does), each line is appended
to it as JSON, otherwise nothing happens.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence


def record(work: str, pgmsg: float, raw: float | None = None, *, unit: str = "/s") -> None:
    """One summary line: pgmsg's figure, the raw ceiling of the same run (if any)."""
    path = os.environ.get("PGMSG_BENCH_SUMMARY")
    if not path:
        return
    with open(path, "a") as out:
        out.write(json.dumps({"work": work, "pgmsg": pgmsg, "raw": raw, "unit": unit}) + "\n")


def find(rows: Sequence[Sequence], prefix: str) -> float | None:
    """The figure of the first (label, figure, ...) row whose label starts with ``prefix``."""
    return next((row[1] for row in rows if row[0].startswith(prefix)), None)


def pairs(rows: Sequence[Sequence], wanted: Iterable[tuple[str, str, str | None]]) -> None:
    """Record (work, pgmsg label prefix, raw label prefix or None) for each found pgmsg row."""
    for work, ours, raw in wanted:
        value = find(rows, ours)
        if value is not None:
            record(work, value, find(rows, raw) if raw else None)
