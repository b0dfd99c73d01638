"""How ``manage.py listen`` runs its workers, each run mode in one place: one process (until
stopped, or ``--until-idle``: until nothing is due), ``--processes N`` under a supervisor, and
``--autoreload`` (a parent that restarts one worker process when a file changes).

``make_worker`` builds a Worker with the command's selection; ``say`` prints a line (None: quiet).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from pgmsg.core import errors, reloader
from pgmsg.core.supervisor import Supervisor
from pgmsg.core.worker import Worker

MakeWorker = Callable[..., Worker]
Say = Callable[[str], None] | None


def check(*, processes: int, autoreload: bool, until_idle: bool) -> None:
    """Refuse a combination of run modes that cannot run together."""
    if processes < 1:
        raise errors.ConfigurationError(f"--processes must be at least 1, got {processes}")
    if autoreload and (processes != 1 or until_idle):
        raise errors.ConfigurationError(
            "--autoreload runs one process until stopped: drop --processes and --until-idle"
        )


def run(
    make_worker: MakeWorker, *, processes: int, autoreload: bool, summary: str, say: Say
) -> int:
    """Run the workers in the mode asked for; the exit status (not 0: an autoreloaded worker
    that failed)."""
    if autoreload:
        return run_autoreloaded(make_worker, summary, say)
    if say:
        say(f"pgmsg listen: {summary}")
    if processes == 1:
        return run_one(make_worker(), say)
    return run_supervised(make_worker, processes, say)


def run_one(worker: Worker, say: Say) -> int:
    worker.run()
    if say:
        say(f"pgmsg listen: stopped (pid {os.getpid()}, {worker.handled} handled)")
    return 0


def run_supervised(make_worker: MakeWorker, processes: int, say: Say) -> int:
    def run_child() -> int:
        make_worker().run()
        return 0

    Supervisor(processes, run_child).run()
    if say:
        say(f"pgmsg listen: stopped ({processes} processes)")
    return 0


def run_autoreloaded(make_worker: MakeWorker, summary: str, say: Say) -> int:
    # A parent restarts a child when a file changes; the child prints the lines.
    if not reloader.in_child():
        return reloader.run_parent()
    if say:
        say(f"pgmsg listen (autoreload): {summary}")
    worker = make_worker(install_signal_handlers=False)
    reloader.run_child(worker.run, worker.stop)
    if say:
        say(f"pgmsg listen: stopped (pid {os.getpid()}, {worker.handled} handled)")
    return 0
