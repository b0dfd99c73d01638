"""The event store under concurrency: many processes on one stream, out-of-order commits."""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import random
import threading
import time
import uuid
from collections import Counter

import pytest
from django.db import connection, connections, transaction

import pgmsg
from pgmsg.events import reads
from pgmsg.events import store as events
from pgmsg.models import StoredEvent
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.scripts.events_contention import contend
from pgmsg_tests.testapp.events_handlers import Step

pytestmark = pytest.mark.django_db(transaction=True)


class TransactionThread:
    """A transaction held open in another thread (its own connection) while the test goes on."""

    def __init__(self) -> None:
        self._tasks: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with transaction.atomic():
                while (task := self._tasks.get()) is not None:
                    try:
                        self._results.put((True, task()))
                    except BaseException as exc:  # handed back to the caller
                        self._results.put((False, exc))
        finally:
            connections.close_all()

    def call(self, func, *args, **kwargs):
        self._tasks.put(lambda: func(*args, **kwargs))
        ok, value = self._results.get(timeout=60)
        if not ok:
            raise value
        return value

    def append(self, *args, **kwargs) -> int:
        return self.call(pgmsg.append, *args, **kwargs)

    def commit(self) -> None:
        self._tasks.put(None)
        self._thread.join(timeout=60)


@contextlib.contextmanager
def open_transaction():
    """A TransactionThread, committed when the block ends."""
    holder = TransactionThread()
    try:
        yield holder
    finally:
        holder.commit()


# -- many processes, one stream ------------------------------------------------------------------


@pytest.mark.processes
def test_many_processes_appending_with_expected_versions_never_duplicate_or_skip(monkeypatch):
    processes, wins = 4, 25
    monkeypatch.setenv("DATABASE_URL", database_url(connection.settings_dict))
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "pgmsg_tests.settings")
    context = multiprocessing.get_context("spawn")
    with context.Pool(processes) as pool:
        start_at = time.time() + 4  # spawned processes need a few seconds to set up
        results = pool.starmap(contend, [("seq-contended", wins, start_at)] * processes)
    total = processes * wins
    all_won = sorted(v for _, won, _ in results for v in won)
    assert all_won == list(range(1, total + 1))  # each version won by exactly one append
    rows = list(StoredEvent.objects.filter(stream_name="seq-contended").order_by("version"))
    assert [r.version for r in rows] == list(range(1, total + 1))  # no gap, no duplicate
    # Each stored event is the one its winner appended after reading version - 1.
    assert [r.data["tag"] for r in rows] == [str(v - 1) for v in range(1, total + 1)]
    assert Counter(r.data["n"] for r in rows) == {pid: wins for pid, _, _ in results}
    assert reads.stream_version("seq-contended") == total
    assert sum(c for _, _, c in results) > 0, "the processes never contended: test is void"


def test_concurrent_re_appends_of_one_message_id_store_one_copy():
    message_id = uuid.uuid4()
    barrier = threading.Barrier(6)
    returned: list = []

    def attempt() -> None:
        try:
            barrier.wait()
            returned.append(pgmsg.append("seq-once", Step(n=1, message_id=message_id)))
        except Exception as exc:
            returned.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert returned == [1] * 6
    assert StoredEvent.objects.filter(message_id=message_id).count() == 1


# -- gap-free reading ----------------------------------------------------------------------------


def test_a_reader_sees_late_commits_that_a_position_reader_would_skip():
    with open_transaction() as slow:
        slow.append("seq-slow", Step(n=1))  # draws a position first, commits last
        pgmsg.append("seq-fast", Step(n=2))
        fast_position = StoredEvent.objects.get(stream_name="seq-fast").position
        slow_position = slow.call(lambda: StoredEvent.objects.get(stream_name="seq-slow").position)
        assert slow_position < fast_position  # a "position > last seen" reader would skip it
        assert pgmsg.read_all() == []  # the horizon holds back the committed fast event
    wait_for(
        lambda: [r.stream_name for r in pgmsg.read_all()] == ["seq-slow", "seq-fast"],
        message="both events readable, slow first",
        timeout=180,
    )


def test_overlapping_writers_committing_out_of_order_lose_nothing_for_a_concurrent_reader():
    """Writer threads hold transactions open for random times, so later positions commit
    before earlier ones, while the main thread keeps reading by checkpoint."""
    writers, transactions_each = 6, 12
    done = threading.Event()
    appended: list[uuid.UUID] = []
    lock = threading.Lock()

    def write(index: int) -> None:
        rng = random.Random(index)
        try:
            for t in range(transactions_each):
                with transaction.atomic():
                    for e in range(rng.randint(1, 3)):
                        event = Step(n=t * 10 + e)
                        pgmsg.append(f"seq-w{index}x{rng.randint(0, 2)}", event)
                        with lock:
                            appended.append(event.message_id)
                        time.sleep(rng.uniform(0, 0.03))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    seen: list = []
    after, late, max_position = events.START, 0, 0
    watcher = threading.Thread(target=lambda: ([t.join() for t in threads], done.set()))
    watcher.start()
    deadline = time.monotonic() + 180  # bounds a broken run; other sessions may delay the end
    while time.monotonic() < deadline:
        finished = done.is_set()
        page = pgmsg.read_all(after, limit=7)
        if page:
            late += sum(1 for r in page if r.position < max_position)
            max_position = max(max_position, *(r.position for r in page))
            seen += page
            after = page[-1].checkpoint
        elif finished and len(seen) >= len(appended):
            break
        else:
            time.sleep(0.005)
    watcher.join()
    assert Counter(r.message_id for r in seen) == Counter(appended)  # each exactly once
    assert len(appended) >= writers * transactions_each
    for stream in {r.stream_name for r in seen}:
        versions = [r.version for r in seen if r.stream_name == stream]
        assert versions == list(range(1, len(versions) + 1)), stream
    # Events with a lower position than one already read arrived later: exactly what a
    # position-based reader would have skipped.
    assert late > 0, "no commit arrived out of order: the test proved nothing"
