"""``listen --autoreload``: Django's autoreloader around one worker, with graceful stops.

Django's ``run_with_reloader`` (what runserver uses) does not fit a worker: its parent dies on
SIGTERM and kills the child with SIGKILL, and a stop signal kept during start-up
(``signals.catch_early``) would leave Ctrl-C with no effect at all. So the two halves are
wired here from Django's own parts: the parent runs the command again as a child, restarts it
when it exits with 3 (a file changed) and passes stop signals on to it; the child runs the
worker in a thread while the reloader watches files in the main thread (which owns signals),
and a stop signal stops both, so the worker finishes the batch in hand and commits.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable

from django.utils import autoreload

from pgmsg.core import signals

#: Django's reloader exits with this status to ask its parent for a restart.
RESTART = 3


def in_child() -> bool:
    """True in the process that runs the worker (the reloader's child)."""
    return os.environ.get(autoreload.DJANGO_AUTORELOAD_ENV) == "true"


def run_parent() -> int:
    """Run this command again as a child until it exits otherwise than to restart; return its
    exit status. Stop signals are passed on to the child as SIGTERM."""
    env = {**os.environ, autoreload.DJANGO_AUTORELOAD_ENV: "true"}
    child: subprocess.Popen | None = None
    stopping = bool(signals.received())

    def forward(signum, frame) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    for signum in signals.STOP_SIGNALS:
        signal.signal(signum, forward)
    while True:
        child = subprocess.Popen(autoreload.get_child_arguments(), env=env, close_fds=False)
        if stopping:  # a signal before the child existed
            child.send_signal(signal.SIGTERM)
        code = child.wait()
        if code != RESTART or stopping:
            return code


class StopOnce:
    """The child's stop-signal handler: stop the worker and the reloader, once.

    Ctrl-C reaches the child twice at once (SIGINT to the process group, then the SIGTERM its
    parent forwards), and Python may run the second handler inside the first. The reloader's
    stop() sets a threading.Event, whose lock is not reentrant: a second set() entered while
    the first holds that lock waits for ever (seen once in CI: the child never stopped).
    """

    def __init__(self, stop: Callable[[], None], reloader: autoreload.BaseReloader) -> None:
        self.stop, self.reloader, self.done = stop, reloader, False

    def __call__(self, signum=None, frame=None) -> None:
        if self.done:
            return
        self.done = True  # before the Event's lock is taken: a nested call returns above
        self.stop()
        self.reloader.stop()


def run_child(run: Callable[[], None], stop: Callable[[], None]) -> None:
    """Run ``run`` (a worker's run) in a thread while the reloader watches the files; return
    once a stop signal made ``stop`` end it. A changed file ends the process with status 3,
    after the worker stopped the same way."""
    reloader = autoreload.get_reloader()
    on_signal = StopOnce(stop, reloader)
    for signum in signals.STOP_SIGNALS:
        signal.signal(signum, on_signal)
    if signals.received():
        on_signal()
    try:
        autoreload.start_django(reloader, run)
    finally:
        # After a stop signal, or on the reloader's SystemExit(3): let the worker finish.
        stop()
        for thread in threading.enumerate():
            if thread.name == "django-main-thread":
                thread.join()
