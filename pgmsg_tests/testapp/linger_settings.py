"""Test settings under which a worker that found work keeps looking for a minute before it
declares itself idle (PGMSG IDLE_AFTER), and wakes otherwise only by NOTIFY."""

from pgmsg_tests.settings import *  # noqa: F403

PGMSG = {**PGMSG, "SWEEP_INTERVAL": 600.0, "IDLE_AFTER": 60.0}  # noqa: F405
