"""The worker's Prometheus instruments; no-ops when prometheus_client is not installed.

Counters move when the claim transaction commits (``transaction.on_commit``), so they count
what the database kept: a batch rolled back by a lost connection counts nothing. The
instruments are created on first use, after ``manage.py listen --metrics-port`` has chosen
prometheus_client's multiprocess mode (see pgmsg/metrics/exporter.py); the numbers that live
in the database (backlog, oldest pending age, dead letters, lag) are read at scrape time by
pgmsg/metrics/collector.py instead.
"""

from __future__ import annotations

import bisect
import functools
import operator
from collections.abc import Mapping, Sequence
from typing import Any

try:
    import prometheus_client
except ImportError:  # the `metrics` extra is not installed
    prometheus_client = None

#: Delivery.kind -> the ``kind`` label: what a source name names.
KINDS = {"notification": "channel", "inbox": "inbox", "event": "subscription"}

DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
BATCH_BUCKETS = (0, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000)


def enabled() -> bool:
    return prometheus_client is not None


class _Noop:
    def labels(self, *args: Any, **kwargs: Any) -> _Noop:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, value: float) -> None:
        pass


_NOOP = _Noop()


@functools.cache
def instruments() -> dict[str, Any]:
    """The instruments by short name (created once per process, on first use)."""
    if prometheus_client is None:
        return {}
    counter, histogram = prometheus_client.Counter, prometheus_client.Histogram
    by_source = ["kind", "source"]
    return {
        "handled": counter(
            "pgmsg_messages_handled", "Messages handled and acknowledged", by_source
        ),
        "failed": counter(
            "pgmsg_messages_failed", "Failed attempts (a retry or a dead letter each)", by_source
        ),
        "retried": counter(
            "pgmsg_messages_retried", "Failed attempts that will be retried", by_source
        ),
        "dead": counter(
            "pgmsg_messages_dead_lettered",
            "Messages given up on (dead letters; a stopped subscription partition)",
            by_source,
        ),
        "duration": histogram(
            "pgmsg_handler_duration_seconds",
            "Time in a message's handlers (each attempt)",
            by_source,
            buckets=DURATION_BUCKETS,
        ),
        "batch": histogram(
            "pgmsg_claim_batch_size",
            "Messages claimed per batch, by worker source",
            ["source"],
            buckets=BATCH_BUCKETS,
        ),
        "reconnects": counter(
            "pgmsg_worker_reconnects", "Database connections a worker lost and re-made", []
        ),
    }


def _get(name: str) -> Any:
    return instruments().get(name, _NOOP)


def handled(counts: Mapping[tuple[str, str], int]) -> None:
    """Count handled messages, given as {(Delivery.kind, source name): how many}."""
    counter = _get("handled")
    for (kind, name), count in counts.items():
        counter.labels(KINDS.get(kind, kind), name).inc(count)


def failed(kind: str, name: str, *, give_up: bool) -> None:
    labels = (KINDS.get(kind, kind), name)
    _get("failed").labels(*labels).inc()
    _get("dead" if give_up else "retried").labels(*labels).inc()


def handler_durations(deliveries: Sequence[Any], durations: Sequence[float]) -> None:
    """Observe a batch's handler durations (seconds, one per Delivery of ``deliveries``, whose
    kind and name label it), one histogram update per source and bucket instead of one per
    message: each observe() takes a lock twice (in multiprocess mode, two writes to the shared
    file), which cost the worker 7 to 15 us per message (bench/metrics.py), about a tenth of a
    message's time at full speed."""
    if prometheus_client is None or not durations:
        return
    sources = set(map(source_of, deliveries))
    if len(sources) == 1:  # the usual batch
        ((kind, name),) = sources
        _observe_many(_duration(kind, name), durations)
        return
    by_source: dict[tuple[str, str], list[float]] = {}
    for delivery, seconds in zip(deliveries, durations, strict=True):
        by_source.setdefault((delivery.kind, delivery.name), []).append(seconds)
    for (kind, name), values in by_source.items():
        _observe_many(_duration(kind, name), values)


def _observe_many(histogram: Any, values: list[float]) -> None:
    # What Histogram.observe() does per value (the first bucket whose bound is >= the value
    # gets 1, the sum gets the value), summed before touching the shared values. These are
    # prometheus_client's internals (unchanged since 0.4): without them, observe one by one.
    try:
        bounds, buckets, total = histogram._upper_bounds, histogram._buckets, histogram._sum
    except AttributeError:
        for value in values:
            histogram.observe(value)
        return
    counts = [0] * len(bounds)
    for value in values:
        counts[bisect.bisect_left(bounds, value)] += 1
    total.inc(sum(values))
    for bucket, count in zip(buckets, counts, strict=True):
        if count:
            bucket.inc(count)


#: A Delivery's (kind, name): the source its counts and durations are labelled by.
source_of = operator.itemgetter(0, 2)


@functools.cache
def _duration(kind: str, name: str) -> Any:
    # Called once per message: look the labelled child up once per source, not every time.
    return _get("duration").labels(KINDS.get(kind, kind), name)


def claimed(source_label: str, count: int) -> None:
    _get("batch").labels(source_label).observe(count)


def reconnected() -> None:
    _get("reconnects").inc()
