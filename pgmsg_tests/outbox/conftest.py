"""Fixtures of the outbox tests."""

from __future__ import annotations

import pytest

from pgmsg_tests.testapp import outbox_declarations as decl


@pytest.fixture
def recorder(monkeypatch, tmp_path):
    """The test destination's record of what it was sent, empty at the start; the destination
    reachable (its "down" switch points at a file that does not exist)."""
    decl.RECORDED.clear()
    monkeypatch.delenv("PGMSG_TEST_RECORD", raising=False)
    monkeypatch.setenv("PGMSG_TEST_UNAVAILABLE", str(tmp_path / "down"))
    yield decl.RECORDED
    decl.RECORDED.clear()
