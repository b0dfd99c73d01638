"""Named SQL statements, read from the ``.sql`` files beside this module.

A file holds blocks that each start with ``-- name: <name>`` followed by comment lines that
describe the statement; values are always passed as parameters (``%(name)s``).
"""

from __future__ import annotations

import re
from importlib import resources

_BLOCK_RE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _parse(text: str) -> dict[str, str]:
    parts = _BLOCK_RE.split(text)
    queries = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        lines = [line for line in body.strip().splitlines() if not line.startswith("--")]
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return queries


def load(filename: str) -> dict[str, str]:
    """The statements of ``pgmsg/sql/<filename>``, by name."""
    return _parse(resources.files(__name__).joinpath(filename).read_text())
