"""`make test-fast` runs `-m "not spark and not browser and not processes"`. So the fast loop
cannot silently grow slow, every test that starts worker processes carries the `processes`
marker: a test that takes the `workers` fixture (on the test or its module), and every test of
a module that spawns `django listen` itself (on the module). Read from the source with ast."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def marks(node: ast.AST | None) -> set[str]:
    """The names X of every `pytest.mark.X` under node (a decorator list item or pytestmark)."""
    found = set()
    for sub in ast.walk(node) if node is not None else ():
        if (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.value, ast.Attribute)
            and sub.value.attr == "mark"
            and isinstance(sub.value.value, ast.Name)
            and sub.value.value.id == "pytest"
        ):
            found.add(sub.attr)
    return found


def module_marks(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return marks(node.value)
    return set()


def spawns_listen(tree: ast.Module) -> bool:
    """A command line written as a list: `[sys.executable, "-m", "django", "listen", ...]`."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            words = {e.value for e in node.elts if isinstance(e, ast.Constant)}
            if "listen" in words and ({"django", "manage.py"} & words):
                return True
    return False


def unmarked(source: str) -> list[str]:
    """The tests of a module's source that start processes without the processes marker."""
    tree = ast.parse(source)
    if "processes" in module_marks(tree):
        return []
    tests = [
        node
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name.startswith("test_")
    ]
    if spawns_listen(tree):
        return [t.name for t in tests]
    return [
        t.name
        for t in tests
        if "workers" in {a.arg for a in t.args.args + t.args.kwonlyargs}
        and not any("processes" in marks(d) for d in t.decorator_list)
    ]


def test_every_test_that_starts_worker_processes_carries_the_processes_marker():
    missing = {
        str(path.relative_to(TESTS)): names
        for path in sorted(TESTS.rglob("test_*.py"))
        if (names := unmarked(path.read_text()))
    }
    assert not missing, f"add @pytest.mark.processes (or to pytestmark): {missing}"


def test_the_check_sees_the_workers_fixture_and_a_spawned_listen():
    assert unmarked("def test_a(workers): pass\n") == ["test_a"]
    assert unmarked("@pytest.mark.processes\ndef test_a(workers): pass\n") == []
    assert unmarked("pytestmark = [pytest.mark.processes]\ndef test_a(workers): pass\n") == []
    spawning = 'CMD = [sys.executable, "-m", "django", "listen"]\ndef test_b(tmp_path): pass\n'
    assert unmarked(spawning) == ["test_b"]
    assert unmarked("def test_c(tmp_path): call_command('listen')\n") == []
