"""The public API is one list: what ``pgmsg`` re-exports, ``__all__`` and what type checkers see."""

from __future__ import annotations

import ast
from pathlib import Path

import pgmsg

INIT = Path(pgmsg.__file__)


def type_checked_names() -> set[str]:
    """The names imported under ``if TYPE_CHECKING:`` in pgmsg/__init__.py."""
    tree = ast.parse(INIT.read_text())
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            return {
                alias.asname or alias.name
                for imp in node.body
                if isinstance(imp, ast.ImportFrom)
                for alias in imp.names
            }
    raise AssertionError("pgmsg/__init__.py has no TYPE_CHECKING block")


def test_all_lists_every_export_sorted():
    exported = {*pgmsg._EXPORTS, *pgmsg._MODULES}
    assert set(pgmsg.__all__) == exported
    assert pgmsg.__all__ == sorted(pgmsg.__all__)


def test_type_checkers_see_every_export():
    assert type_checked_names() == {*pgmsg._EXPORTS, *pgmsg._MODULES}


def test_star_import_gives_the_documented_names():
    namespace: dict = {}
    exec("from pgmsg import *", namespace)
    for name in ("START", "Checkpoint", "NO_STREAM", "Outbox", "publish", "read_all"):
        assert name in namespace, name


def test_errors_import_as_a_module_and_are_the_core_s_classes():
    from pgmsg.core import errors as core_errors
    from pgmsg.errors import PayloadError, PgmsgError

    assert PayloadError is core_errors.PayloadError and PgmsgError is core_errors.PgmsgError
    import pgmsg.errors

    assert pgmsg.errors is core_errors


def test_the_live_endpoint_is_a_module_of_the_package():
    import pgmsg.live

    assert pgmsg.live.stream is pgmsg.__getattr__("live").stream
