"""docs/architecture.md names files that exist, and its map of the package lists every module.

Files move; a map that names a file that is gone, or leaves a module out, misleads the reader
it is written for.
"""

from __future__ import annotations

import importlib
import re

from pgmsg_tests.conftest import ROOT

DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "pgmsg"


def tree() -> list[str]:
    """The paths the map (the first code block) lists, e.g. ``core/worker.py``, ``channels/``."""
    block = re.search(r"^```\n(pgmsg/\n.*?)^```", DOC.read_text(), re.S | re.M).group(1)
    paths, parents = [], {}
    for line in block.splitlines()[1:]:
        if not line.strip() or not line.startswith("  "):
            continue
        indent = len(line) - len(line.lstrip())
        names = re.split(r"\s{2,}", line.strip())[0]
        if not re.fullmatch(r"[\w./ ]+", names) or not re.search(r"\.py\b|/", names):
            continue  # a description's continuation line
        parent = parents.get(indent - 2, "") if indent > 2 else ""
        for name in names.split():
            paths.append(parent + name)
        if names.endswith("/"):
            parents[indent] = parent + names
    return paths


def test_the_map_names_only_what_exists():
    listed = tree()
    assert "core/worker.py" in listed and "channels/" in listed  # the parser reads the map
    missing = [p for p in listed if not (PACKAGE / p).exists()]
    assert not missing, f"docs/architecture.md lists what is not in pgmsg/: {missing}"


def test_the_map_lists_every_top_level_module_and_folder_and_every_core_module():
    listed = set(tree())
    top = {
        p.name + ("/" if p.is_dir() else "")
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))
        and p.name not in ("migrations", "__pycache__")
    }
    core = {f"core/{p.name}" for p in (PACKAGE / "core").glob("*.py") if p.name != "__init__.py"}
    listed |= {p.split("/")[0] + "/" for p in listed if "/" in p}  # management/commands/
    unlisted = sorted((top | core) - listed)
    assert not unlisted, f"docs/architecture.md's map leaves out: {unlisted}"


def test_every_file_the_text_names_exists():
    named = set(re.findall(r"`([\w/]+\.(?:py|sql|md))`", DOC.read_text()))
    named |= set(re.findall(r"\b(docs/\w+\.md)", DOC.read_text()))
    assert "channels/sending.py" in named
    missing = sorted(p for p in named if not any((base / p).exists() for base in (PACKAGE, ROOT)))
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def test_every_named_statement_the_text_names_is_in_the_file_it_names():
    # e.g. "`insert_notification` (`channels/notifications.sql`)"
    text = DOC.read_text()
    pairs = re.findall(r"`(\w+)`(?: / `(\w+)`)? (?:in )?\(?`(\w+/\w+\.sql)`", text)
    assert pairs, "no (statement, file) pair found"
    for first, second, path in pairs:
        sql = (PACKAGE / path).read_text()
        for name in filter(None, (first, second)):
            assert f"-- name: {name}\n" in sql, f"{name} is not in {path}"


def sources() -> str:
    return "\n".join(p.read_text() for pattern in ("*.py", "*.sql") for p in PACKAGE.rglob(pattern))


def resolves(dotted: str) -> bool:
    """``pgmsg.notify``, ``core.batch.failure``, ``batch.Redo`` (a core module) and
    ``psycopg.sql.Identifier`` import; ``Class.method`` is defined; ``result.done`` is an
    attribute some code sets or reads."""
    parts = dotted.split(".")
    for prefix in ("", "pgmsg.", "pgmsg.core."):
        for cut in range(len(parts), 0, -1):
            try:
                value = importlib.import_module(prefix + ".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                value = getattr(value, attr, None)
            if value is not None:
                return True
    code = sources()
    if f"class {parts[0]}" in code:
        return all(f"def {name}(" in code for name in parts[1:])
    return re.search(rf"\.{parts[-1]}\b", code) is not None


def test_every_name_the_text_gives_in_code_is_in_the_code():
    text = DOC.read_text()
    code = sources()
    names = {
        n for n in re.findall(r"`([A-Za-z_][\w.]*)(?:\(.*?\))?`", text) if not n.endswith(".py")
    }
    names -= {"ast", "importlib", "EXPLAIN", "manage.py"}  # not pgmsg's own code
    unknown = sorted(
        n for n in names if not (resolves(n) if "." in n else re.search(rf"\b{n}\b", code))
    )
    assert not unknown, f"docs/architecture.md names what the code does not have: {unknown}"
