"""Run in spawned processes by the contention test: import this before Django is set up."""

from __future__ import annotations

import os
import time


def contend(stream: str, wins: int, start_at: float) -> tuple[int, list[int], int]:
    """Append ``wins`` events to ``stream``, each with the version just read as expected
    version, retrying on ConcurrencyError. Returns (pid, versions won, conflicts)."""
    import django

    django.setup()
    from django.db import connections

    import pgmsg
    from pgmsg.core import errors
    from pgmsg.events import reads
    from pgmsg_tests.testapp.events_handlers import Step

    while time.time() < start_at:  # start together, so that appends really contend
        time.sleep(0.005)
    won, conflicts = [], 0
    while len(won) < wins:
        version = reads.stream_version(stream)
        try:
            won.append(
                pgmsg.append(
                    stream, Step(n=os.getpid(), tag=str(version)), expected_version=version
                )
            )
        except errors.ConcurrencyError:
            conflicts += 1
    connections.close_all()
    return os.getpid(), won, conflicts
