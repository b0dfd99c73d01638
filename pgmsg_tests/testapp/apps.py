import os
import sys
import time

from django.apps import AppConfig


class TestappConfig(AppConfig):
    name = "pgmsg_tests.testapp"
    label = "testapp"

    def ready(self) -> None:
        if os.environ.get("PGMSG_TEST_SLOW_START"):
            # A worker start-up that takes a while, for tests that signal it mid-start.
            from pgmsg.core import sources

            sources.register("test_slow_start", _slow_start)


def _slow_start(options) -> list:
    print("pgmsg test: slow start", file=sys.stderr, flush=True)
    time.sleep(float(os.environ["PGMSG_TEST_SLOW_START"]))
    return []
