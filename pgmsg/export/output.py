"""Output paths: where datasets go, whether a local one can be written, what a run added."""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from pgmsg.core import errors

#: Where Spark's streaming file sink logs the files of each committed micro-batch.
SINK_LOG = "_spark_metadata"


def local_path(path: str) -> Path | None:
    """The local directory of ``path`` (a plain path or file: URL); None for other URLs."""
    parts = urlsplit(path)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    return Path(path) if not parts.scheme or len(parts.scheme) == 1 else None


def join(output: str, name: str) -> str:
    return output.rstrip("/") + "/" + name


def check_writable(output: str) -> None:
    """Fail before reading anything when a local output directory could not be written.

    Nothing is created here: the directory appears when Spark writes the first dataset, so a
    run that fails before (bad master, no Java) leaves no empty directory behind.
    """
    local = local_path(output)
    if local is None:
        return  # hdfs://, s3a://, ...: Spark reports problems when it writes
    existing = local.absolute()
    while not existing.exists():
        existing = existing.parent
    if existing != local.absolute() and not existing.is_dir():
        raise errors.ExportError(
            f"export: output path {output!r} is not writable: {existing} is not a directory"
        )
    if not existing.is_dir():
        raise errors.ExportError(f"export: output path {output!r} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise errors.ExportError(
            f"export: output path {output!r} is not writable: no write permission on {existing}"
        )


def parquet_files(path: str) -> dict[str, int] | None:
    """Every data file of a local dataset with its size (None when the output is not local)."""
    local = local_path(path)
    if local is None:
        return None
    if not local.is_dir():
        return {}
    return {
        str(f): f.stat().st_size
        for f in local.rglob("*.parquet")
        if not any(part.startswith(("_", ".")) for part in f.relative_to(local).parts)
    }


def parquet_rows(path: str) -> int:
    import pyarrow.parquet as pq

    return pq.read_metadata(path).num_rows


def sink_files(path: str) -> list[str] | None:
    """The files a streaming export committed to the dataset at local ``path``, in order.

    Spark's file sink lists them in ``_spark_metadata/<batch>`` (JSON lines after a version
    line; every tenth batch a ``.compact`` file holding all earlier ones). Files written by a
    micro-batch that never committed (the process was killed) are not listed: a reader that
    does not go through Spark must read these files only. None when there is no such log.
    """
    local = local_path(path)
    log = local / SINK_LOG if local else None
    if log is None or not log.is_dir():
        return None
    batches = {}
    for entry in log.iterdir():
        name = entry.name.removesuffix(".compact")
        if name.isdigit():
            batches[int(name)] = entry
    compacts = [b for b, entry in batches.items() if entry.name.endswith(".compact")]
    first = max(compacts, default=0)
    files: dict[str, None] = {}
    for batch in sorted(b for b in batches if b >= first):
        for line in batches[batch].read_text().splitlines()[1:]:
            record = json.loads(line)
            target = unquote(urlsplit(record["path"]).path)
            if record.get("action", "add") == "delete":
                files.pop(target, None)
            else:
                files[target] = None
    return list(files)


def remove_uncommitted(path: str) -> list[str]:
    """Delete the data files of a streaming dataset that its sink log does not list.

    Only safe while no streaming query writes to ``path`` (the follow export holds its lock):
    such files are what a killed micro-batch left; the batch is replayed from its offsets.
    """
    committed = sink_files(path)
    found = parquet_files(path)
    if committed is None or not found:
        return []
    orphans = sorted(set(found) - set(committed))
    for orphan in orphans:
        os.unlink(orphan)
    return orphans
