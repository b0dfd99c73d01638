"""Test settings with a sweep too slow to matter: a worker under them wakes only by NOTIFY."""

from pgmsg_tests.settings import *  # noqa: F403

PGMSG = {**PGMSG, "SWEEP_INTERVAL": 600.0}  # noqa: F405
