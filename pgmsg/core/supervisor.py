"""Run N worker processes under one supervisor that restarts a child that crashed.

SIGTERM or SIGINT is passed on to the children as SIGTERM, which finish the message in hand and
exit; a second signal kills them at once. The children ignore SIGINT: Ctrl-C in a terminal
reaches the whole process group, and a child that got both the terminal's SIGINT and the
supervisor's SIGTERM would take them for two signals and drop the work in hand.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable

from django.db import connections

from pgmsg.core import signals

logger = logging.getLogger(__name__)

#: A child that dies sooner than this after its start counts as crashing at start-up; its
#: restarts are spaced out (doubling up to MAX_RESTART_DELAY) instead of spinning.
QUICK_CRASH_SECONDS = 5.0
MAX_RESTART_DELAY = 30.0


class Supervisor:
    def __init__(self, processes: int, run_child: Callable[[], int]) -> None:
        self.processes = processes
        self.run_child = run_child
        self.children: dict[int, float] = {}  # pid -> start time
        self.signals = 0
        self.restart_delay = 0.0

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        if signals.received():  # stopped during start-up: nothing to start
            return 0
        for _ in range(self.processes):
            self._spawn()
        while self.children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
                continue
            started = self.children.pop(pid, None)
            if started is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            if self.signals:
                continue
            if code == 0:
                logger.info("pgmsg supervisor: worker %s exited", pid)
                continue
            lived = time.monotonic() - started
            self.restart_delay = (
                min(max(self.restart_delay * 2, 1.0), MAX_RESTART_DELAY)
                if lived < QUICK_CRASH_SECONDS
                else 0.0
            )
            logger.error(
                "pgmsg supervisor: worker %s died (exit %s) after %.1fs; restarting in %.1fs",
                pid,
                code,
                lived,
                self.restart_delay,
            )
            self._pause(self.restart_delay)
            if not self.signals:
                self._spawn()
        return 0

    def _spawn(self) -> None:
        connections.close_all()  # a forked child must not share the parent's sockets
        pid = os.fork()
        if pid == 0:  # child
            signals.catch_early()  # a SIGTERM before its worker is ready still stops it
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            code = 1
            try:
                code = self.run_child()
            except BaseException:
                logger.exception("pgmsg worker %s crashed", os.getpid())
            finally:
                os._exit(code)
        self.children[pid] = time.monotonic()
        logger.info("pgmsg supervisor: started worker %s", pid)

    def _on_signal(self, signum, frame) -> None:
        self.signals += 1
        forward = signal.SIGTERM if self.signals == 1 else signal.SIGKILL
        for pid in list(self.children):
            try:
                os.kill(pid, forward)
            except ProcessLookupError:
                pass

    def _pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.signals and time.monotonic() < deadline:
            time.sleep(0.1)
