"""The README's snippets and commands work as written.

Every Python snippet compiles and names only what it imports or defines. The self-contained
ones run, in a process of their own, against the test database: the modules they show (a
``# shop/<module>.py`` first line) become a ``shop`` package on a temporary path.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import subprocess
import sys

import pytest
from django.db import connection

from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import ROOT, WorkerProcesses

README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README.read_text()) if lang == language]


def unbound_names(source: str) -> set[str]:
    tree = ast.parse(source)
    bound, used = set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return used - bound


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_snippet_compiles_and_imports_what_it_uses(index):
    source = blocks("python")[index]
    compile(source, f"README.md python block {index}", "exec")
    assert unbound_names(source) == set(), source


def module_of(source: str) -> str | None:
    match = re.match(r"# (shop/\w+\.py)", source)
    return match.group(1) if match else None


def runnable(source: str) -> bool:
    # Settings and models need a project; the rest runs as is.
    return not any(
        text in source for text in ("INSTALLED_APPS", "DATABASES", "models.Model", "shop.models")
    )


RUNNER = """
import django, importlib, sys
django.setup()
for index, (module, source) in enumerate(SNIPPETS):
    if module is None:
        exec(compile(source, f"README.md snippet {index}", "exec"), {"__name__": "snippet"})
    else:
        importlib.import_module(module)
print("ran", len(SNIPPETS))
"""


@pytest.mark.django_db(transaction=True)
def test_self_contained_snippets_run_against_the_database(tmp_path):
    package = tmp_path / "shop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    files: dict[str, str] = {}
    steps: list[tuple[str | None, str]] = []
    for source in blocks("python"):
        if not runnable(source):
            continue
        path = module_of(source)
        if path is None or path.endswith("views.py"):
            steps.append((None, source))
        else:
            files[path] = files.get(path, "") + "\n" + source
            steps.append((path[:-3].replace("/", "."), ""))
    for path, source in files.items():
        (tmp_path / path).write_text(source)
    assert len(steps) >= 5, steps
    env = WorkerProcesses(tmp_path).env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    script = f"SNIPPETS = {steps!r}\n{RUNNER}"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f"ran {len(steps)}")


def test_install_commands_name_an_installable_directory(tmp_path):
    commands = [
        line.split("#")[0].strip()
        for block in blocks("sh")
        for line in block.splitlines()
        if "pip install" in line
    ]
    assert "pip install ./pgmsg" in commands  # after `git clone ... pgmsg`
    assert any(
        "git clone" in line and line.split("#")[0].split()[-1] == "pgmsg"
        for block in blocks("sh")
        for line in block.splitlines()
    )
    # From the directory above the checkout, ./pgmsg is the checkout: it must be installable.
    assert (ROOT / "pyproject.toml").exists() and "[build-system]" in (
        ROOT / "pyproject.toml"
    ).read_text()
    # Not the package directory inside the checkout (that is what failed before).
    assert not (ROOT / "pgmsg" / "pyproject.toml").exists()


@pytest.mark.django_db
def test_no_warning_that_is_not_the_users_from_a_manage_py_call():
    # On a migrated database: on one where migrate never ran, check reports pgmsg.E010.
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env["DATABASE_URL"] = database_url(connection.settings_dict)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr


def test_every_name_a_snippet_imports_from_the_project_is_declared_in_a_snippet():
    # `from shop.models import Invoice` needs a `# shop/models.py` snippet that defines Invoice:
    # otherwise the listeners module a newcomer copies fails at start-up (pgmsg imports it).
    defined: dict[str, set[str]] = {}
    for source in blocks("python"):
        path = module_of(source)
        if path:
            tree = ast.parse(source)
            names = {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
            names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets}
            defined.setdefault(path[:-3].replace("/", "."), set()).update(names)
    missing = [
        f"{node.module}.{alias.name}"
        for source in blocks("python")
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shop.")
        for alias in node.names
        if alias.name not in defined.get(node.module, set())
    ]
    assert not missing, f"imported in the README but declared in none of its snippets: {missing}"


def test_no_message_tells_to_pip_install_pgmsg_from_pypi():
    # pgmsg is not on PyPI: `pip install 'pgmsg[metrics]'` fails for whoever follows it.
    offenders = sorted(
        str(path.relative_to(ROOT / "pgmsg"))
        for path in (ROOT / "pgmsg").rglob("*.py")
        if re.search(r"pip install '?pgmsg\b", path.read_text())
    )
    assert not offenders, offenders
