"""`listen --autoreload`'s child handler of stop signals (the processes: test_listen_output.py)."""

from __future__ import annotations

from django.utils import autoreload

from pgmsg.core.reloader import StopOnce


class NestedSignalReloader(autoreload.StatReloader):
    """Django's reloader, where a second stop signal arrives while stop() runs: Ctrl-C sends
    SIGINT to the group and the parent forwards a SIGTERM, and Python can run the second
    handler inside the first, while Event.set() holds its (not reentrant) lock."""

    def __init__(self) -> None:
        super().__init__()
        self.stops = 0
        self.handler = None

    def stop(self) -> None:
        self.stops += 1
        self.handler()  # the second signal, nested
        super().stop()


def test_a_second_signal_inside_the_first_handler_stops_nothing_twice():
    worker_stops = []
    reloader = NestedSignalReloader()
    reloader.handler = StopOnce(lambda: worker_stops.append(1), reloader)

    reloader.handler()  # without the guard: the nested call recurses (or, in the real
    reloader.handler()  # case, waits for ever on the Event's lock)

    assert reloader.should_stop
    assert (reloader.stops, len(worker_stops)) == (1, 1)
