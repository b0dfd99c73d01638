"""The worker raises the garbage collector's first threshold above one batch while it runs."""

import gc

import pytest

from pgmsg.core.worker import Worker
from pgmsg.core.young_generation import TRACKED_PER_MESSAGE, young_generation_for


class ThresholdProbe:
    """A source that notes the collector's thresholds each time the worker asks it for work."""

    label = "probe"
    wake_payloads: list[str] = []

    def __init__(self) -> None:
        self.seen: list[tuple[int, int, int]] = []

    def wants(self, wake_payload: str) -> bool:
        return False

    def process_batch(self, worker) -> int:
        self.seen.append(gc.get_threshold())
        return 0

    def seconds_until_due(self, worker) -> float | None:
        return None


@pytest.fixture
def thresholds():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # CPython's default, whatever the test run set
    yield
    gc.set_threshold(*before)


@pytest.mark.django_db(transaction=True)
def test_a_running_worker_keeps_a_batch_below_the_first_threshold_and_restores_it(thresholds):
    probe = ThresholdProbe()
    Worker(sources=[probe], until_idle=True, install_signal_handlers=False, batch_size=1000).run()
    assert probe.seen, "the worker never asked its source for work"
    assert set(probe.seen) == {(TRACKED_PER_MESSAGE * 1000, 10, 10)}
    assert gc.get_threshold() == (700, 10, 10)


def test_a_higher_threshold_or_collection_turned_off_is_left_alone(thresholds):
    for setting in [(50_000, 5, 5), (0, 10, 10)]:
        gc.set_threshold(*setting)
        with young_generation_for(100):
            assert gc.get_threshold() == setting
        assert gc.get_threshold() == setting


def test_the_threshold_comes_back_when_the_run_fails(thresholds):
    class Broken(Exception):
        pass

    with pytest.raises(Broken), young_generation_for(200):
        assert gc.get_threshold() == (TRACKED_PER_MESSAGE * 200, 10, 10)
        raise Broken
    assert gc.get_threshold() == (700, 10, 10)
