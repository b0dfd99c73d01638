"""The package's shape: imports run one way (capability -> core), and no import circles.

Read with the standard library's ast, so it sees function-level imports too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pgmsg

PACKAGE = Path(pgmsg.__file__).parent
#: The layers: the core at the bottom, capabilities over it, and what wires them together
#: (app config, checks, admin, commands, urls, the public API) on top.
CORE = "pgmsg.core"
CAPABILITIES = ("pgmsg.channels", "pgmsg.events", "pgmsg.inbox", "pgmsg.export", "pgmsg.outbox")
#: Packages of the top layer that wire capabilities together for users (the live endpoint
#: streams events and broadcast channels): they may import capabilities, nothing imports them
#: from below.
TOP_PACKAGES = ("pgmsg.live",)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str) -> set[str]:
    """The pgmsg modules a module imports (``from pgmsg.x import y`` counts pgmsg.x.y when
    that is a module, pgmsg.x otherwise)."""
    tree = ast.parse(path.read_text())
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("pgmsg"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            if not base.startswith("pgmsg"):
                continue
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


MODULES = {
    module_name(p): p
    for p in PACKAGE.rglob("*.py")
    if "migrations" not in p.relative_to(PACKAGE).parts
}
GRAPH = {name: imports_of(path, name) for name, path in MODULES.items()}


def area(module: str) -> str | None:
    for prefix in (CORE, *CAPABILITIES):
        if module == prefix or module.startswith(prefix + "."):
            return prefix
    return None


def test_the_core_imports_no_capability_and_nothing_above_it():
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if area(module) == CORE
        for target in targets
        if area(target) != CORE
    )
    assert not wrong, "the core must import only the core:\n" + "\n".join(wrong)


def test_top_packages_are_imported_by_no_capability_and_not_by_the_core():
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if area(module) is not None
        for target in targets
        if any(target == top or target.startswith(top + ".") for top in TOP_PACKAGES)
    )
    assert all(area(top) is None and top in MODULES for top in TOP_PACKAGES)
    assert not wrong, "only the top layer may import pgmsg.live:\n" + "\n".join(wrong)


def test_capabilities_import_only_the_core_and_the_models():
    top = {m for m in MODULES if area(m) is None and not m.startswith("pgmsg.models")}
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if area(module) in CAPABILITIES
        for target in targets
        if target in top
    )
    assert not wrong, "a capability reaches up into the wiring layer:\n" + "\n".join(wrong)


def capability_crossings(graph: dict[str, set[str]]) -> list[str]:
    """Where a capability imports another capability: each stands on the core and the models
    alone, and the wiring layer (pgmsg/apps.py, the commands) puts them together."""
    return sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if area(module) in CAPABILITIES
        for target in targets
        if area(target) in CAPABILITIES and area(target) != area(module)
    )


def test_no_capability_imports_another():
    wrong = capability_crossings(GRAPH)
    assert not wrong, "a capability imports another capability:\n" + "\n".join(wrong)


def test_the_checker_sees_a_capability_importing_another():
    graph = {"pgmsg.events.x": {"pgmsg.export.y", "pgmsg.events.z", "pgmsg.core.sql"}}
    assert capability_crossings(graph) == ["pgmsg.events.x imports pgmsg.export.y"]


def test_there_is_no_import_circle():
    cycles = []
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(GRAPH[node]):
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(GRAPH):
        if node not in state:
            visit(node)
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_module_dodges_an_import_with_importlib():
    # pgmsg/__init__.py re-exports lazily by design (Django imports it before models are
    # ready), and so does pgmsg/export/__init__.py (Spark's Python workers import
    # pgmsg.export.spark_source without Django); nothing else may load modules by name.
    lazy = {"pgmsg", "pgmsg.export"}
    offenders = sorted(
        name
        for name, path in MODULES.items()
        if name not in lazy and "import_module(" in path.read_text()
    )
    assert not offenders, f"importlib used to reach a module: {offenders}"


def test_the_checker_sees_a_circle_when_there_is_one():
    # The circle check walks GRAPH; make sure it would catch one by adding a fake edge.
    GRAPH["pgmsg.core.conf"].add("pgmsg.core.worker")
    try:
        try:
            test_there_is_no_import_circle()
        except AssertionError as exc:
            assert "pgmsg.core.conf" in str(exc)
        else:
            raise AssertionError("a circle went unseen")
    finally:
        GRAPH["pgmsg.core.conf"].discard("pgmsg.core.worker")


def private_uses(source: str, name: str) -> list[str]:
    """Where a module reaches a private name (``_x``) of another pgmsg module: ``from
    pgmsg.m import _x`` or ``m._x`` with ``m`` an imported pgmsg module."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> pgmsg module
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES and a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pgmsg"):
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"{name}: from {node.module} import {a.name}")
                elif f"{node.module}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and aliases[node.value.id] != name
        ):
            found.append(f"{name}: {aliases[node.value.id]}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names():
    found = [use for name, path in MODULES.items() for use in private_uses(path.read_text(), name)]
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_the_checker_sees_a_private_name_used_across_modules():
    source = (
        "from pgmsg.events import store\n"
        "from pgmsg.core.batch import _fast\n"
        "def f():\n"
        "    return store._cause\n"
    )
    assert private_uses(source, "pgmsg.x") == [
        "pgmsg.x: from pgmsg.core.batch import _fast",
        "pgmsg.x: pgmsg.events.store._cause",
    ]


def test_the_tests_mirror_the_package():
    # pgmsg_tests/<folder>/ tests pgmsg/<folder>/; docs/ checks the documentation, scripts/ holds
    # the programs process-level tests start, testapp/ and typecheck/ are fixtures.
    tests = PACKAGE.parent / "pgmsg_tests"
    apart = {"docs", "scripts", "testapp", "typecheck"}
    folders = {p.name for p in tests.iterdir() if (p / "__init__.py").exists()} - apart
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders <= packages, f"test folders with no pgmsg package: {folders - packages}"
    tested = {"core", "admin", "metrics", *(c.rpartition(".")[2] for c in CAPABILITIES)}
    tested |= {t.rpartition(".")[2] for t in TOP_PACKAGES}
    assert tested <= folders, f"pgmsg packages without a test folder: {tested - folders}"
    scripts = [p.name for p in (tests / "scripts").glob("*.py") if p.name != "__init__.py"]
    assert scripts and not [p for p in tests.rglob("test_*.py") if p.parent.name == "scripts"]


def test_the_package_imports_no_development_or_test_code():
    # pgmsg_dev (the embedded PostgreSQL) and pgmsg_tests are not installed with pgmsg.
    wrong = sorted(
        f"{name} imports {node.module or node.names[0].name}"
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        and any(
            (n or "").split(".")[0] in ("pgmsg_dev", "pgmsg_tests")
            for n in [getattr(node, "module", None), *(a.name for a in node.names)]
        )
    )
    assert not wrong, "\n".join(wrong)
