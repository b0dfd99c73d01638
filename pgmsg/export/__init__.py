"""Export to Parquet with Spark: the table registry, planning, Spark set-up, the data source,
output paths, watermarks, batch runs, the streaming follow export and the lake report.

Names are re-exported lazily so that ``pgmsg.export.spark_source`` imports without Django (Spark's
Python workers load it) and nothing here imports models before Django is ready.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ExportSummary": "pgmsg.export.run",
    "MODES": "pgmsg.export.planning",
    "PARTITION_BY": "pgmsg.export.planning",
    "TablePlan": "pgmsg.export.planning",
    "TableResult": "pgmsg.export.run",
    "TableSpec": "pgmsg.export.tables",
    "WRITERS": "pgmsg.export.run",
    "export_tables": "pgmsg.export.run",
    "java_command": "pgmsg.export.session",
    "plan": "pgmsg.export.planning",
    "register": "pgmsg.export.tables",
    "registered": "pgmsg.export.tables",
    "split_range": "pgmsg.export.reading",
    "start_spark": "pgmsg.export.session",
    "watermark": "pgmsg.export.watermarks",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pgmsg.export' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
