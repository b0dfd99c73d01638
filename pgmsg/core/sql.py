"""Named SQL statements, read from the ``.sql`` files that each capability keeps beside its code.

A file holds blocks that each start with ``-- name: <name>`` followed by comment lines that
describe the statement; values are always passed as parameters (``%(name)s``). A few statements
take identifiers too (a project's own table in a model inbox): those are written with
``{placeholders}`` and composed with ``psycopg.sql`` by the caller, never with string formatting.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import LiteralString, cast

_BLOCK_RE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)

#: Every file loaded so far, as {(package, filename): {name: statement}}: what the test that
#: prepares every statement and looks for unused ones walks.
loaded: dict[tuple[str, str], dict[str, LiteralString]] = {}


def _parse(text: str) -> dict[str, LiteralString]:
    parts = _BLOCK_RE.split(text)
    queries: dict[str, LiteralString] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        lines = [line for line in body.strip().splitlines() if not line.startswith("--")]
        # The text comes from a file shipped in the package, never from input: a literal.
        queries[name] = cast(LiteralString, "\n".join(lines).strip().rstrip(";"))
    return queries


def load(package: str, filename: str) -> dict[str, LiteralString]:
    """The statements of the file ``filename`` in the folder of ``package``, by name.

    Call it as ``sql.load(__package__, "inbox.sql")`` from a capability's module.
    """
    key = (package, filename)
    if key not in loaded:
        loaded[key] = _parse(resources.files(package).joinpath(filename).read_text())
    return loaded[key]


_FUNCTION_RE = re.compile(r"^-- function: (\w+)\s*$", re.MULTILINE)


def functions(package: str) -> dict[str, str]:
    """The current text of the SQL functions in ``package``'s functions.sql, by name: each
    ``-- function: <name>`` block's CREATE OR REPLACE FUNCTION statement.

    Not statements to run: migrations apply frozen copies (pgmsg/migrations/README.md). A
    function made at run time from one (events/subscriptions.py) reads it here.
    """
    parts = _FUNCTION_RE.split(resources.files(package).joinpath("functions.sql").read_text())
    found = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        lines = body.strip().splitlines()
        while lines and lines[0].startswith("--"):  # the comment before the statement
            lines.pop(0)
        found[name] = "\n".join(lines) + "\n"
    return found


def numbered(query: str, names: list[str]) -> bytes:
    """``query`` as libpq's own calls take it: each ``%(name)s`` or ``%(name)b`` of ``names``
    becomes ``$1``, ``$2``, ... in that order (for the few statements sent below psycopg's
    cursor: claims.send_record, notify()'s send). A name missing from the query is an error."""
    for number, name in enumerate(names, start=1):
        placeholder = re.search(rf"%\({re.escape(name)}\)[sb]", query)
        if placeholder is None:
            raise ValueError(f"no %({name})s in {query!r}")
        query = query.replace(placeholder.group(), f"${number}")
    return query.encode()
