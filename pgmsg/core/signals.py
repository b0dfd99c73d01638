"""Stop signals that arrive before a worker or supervisor is ready to honour them.

``manage.py listen`` calls ``catch_early()`` first thing, before it builds workers: a SIGTERM
or SIGINT that lands during start-up is kept here instead of killing the process, and the
Worker or Supervisor that takes over treats it as a graceful stop request.
"""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_received: list[int] = []


def _keep(signum, frame) -> None:
    _received.append(signum)


def catch_early() -> None:
    """Keep stop signals until someone asks (a signal ignored on entry stays ignored)."""
    _received.clear()
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _keep)


def received() -> int | None:
    """The first stop signal kept since catch_early(), or None."""
    return _received[0] if _received else None
