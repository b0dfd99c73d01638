"""Benchmark: what the Prometheus metrics cost the worker's hot path.

One in-process Worker drains a prefilled backlog of N exactly-once notifications (the drain of
bench/drain.py: no-op listener, timed from the first claim to the empty table), in three
set-ups, each in a fresh child process, rounds alternating so that load changes hit all three:

- off: prometheus_client cannot be imported (what a project without the `metrics` extra gets);
- in-process: prometheus_client installed, one process's own registry (e.g. `listen` without
  `--metrics-port`: the instruments count, nothing serves them);
- multiprocess: prometheus_client's multiprocess mode, as `listen --metrics-port` sets it up
  (every value in an mmap'ed file shared with the exporter).

Per batch the worker observes the batch's handler durations (summed per bucket first), one
batch-size observation and, after the commit, the handled counter. The ratio column is each
set-up's rate over the rate with metrics off in the same round. The last table times the
instruments alone, called as the worker calls them, in the same child processes.

    python bench/metrics.py [--n 50000] [--reps 3]

Uses DATABASE_URL's server (or the embedded default) and a scratch database that it drops
and re-creates.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common, summary  # noqa: E402
from bench.common import spread  # noqa: E402

SCRATCH_DB = "pgmsg_bench_metrics"
MODES = ("off", "in-process", "multiprocess")


def child(mode: str, n: int) -> None:
    """Run in a fresh process: set up metrics as ``mode`` says, drain, print the rate."""
    if mode == "off":
        sys.modules["prometheus_client"] = None  # type: ignore[assignment]  # ImportError
    common.django_setup(os.environ["DATABASE_URL"], "bench.settings", migrate=False)
    from bench import drain
    from pgmsg.core import instruments as metrics

    created = None
    if mode == "multiprocess":
        from pgmsg.metrics import exporter

        created = exporter.use_multiprocess_dir()
    assert metrics.enabled() == (mode != "off"), f"metrics.enabled() is wrong for {mode}"
    try:
        started = time.perf_counter()
        handled = drain.pgmsg_drain()
        rate = n / (time.perf_counter() - started)
        assert handled == n, f"handled {handled} of {n}"
        if mode != "off":
            # The instruments really counted: the handled counter holds every message.
            counted = sum(
                sample.value
                for family in metrics.prometheus_client.REGISTRY.collect()
                for sample in family.samples
                if sample.name == "pgmsg_messages_handled_total"
            )
            if mode == "in-process":
                assert counted == n, f"the handled counter says {counted}, not {n}"
    finally:
        if created:
            from pgmsg.metrics import exporter

            exporter.remove_multiprocess_dir(created)
    print(rate, instruments_cost(metrics))


def instruments_cost(metrics: object, messages: int = 200_000, batch: int = 100) -> float:
    """Microseconds per message of the instruments alone, called as the worker calls them: per
    batch of 100, the batch's handler durations, one batch-size observation and the handled
    counter."""
    counts = {("notification", "bench.tick"): batch}  # what run_batch counts per batch
    delivery = ("notification", 0, "bench.tick", 0)  # a Delivery's fields
    started = time.perf_counter()
    for _ in range(messages // batch):
        durations = []
        for _ in range(batch):
            durations.append(0.0001)  # what run_batch keeps
        metrics.handler_durations([delivery] * batch, durations)  # type: ignore[attr-defined]
        metrics.claimed("channels", batch)  # type: ignore[attr-defined]
        metrics.handled(counts)  # type: ignore[attr-defined]
    return (time.perf_counter() - started) / messages * 1e6


def timed(url: str, mode: str, n: int) -> tuple[float, float]:
    from bench import drain

    drain.fill_pgmsg(url, n)
    env = dict(os.environ, DATABASE_URL=url)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--n", str(n)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    rate, cost = out.stdout.strip().splitlines()[-1].split()
    return float(rate), float(cost)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.n)
        return

    url = common.scratch_url(SCRATCH_DB)
    with psycopg.connect(url, autocommit=True) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
        autovacuum = conn.execute("SHOW autovacuum").fetchone()[0]
    print(
        f"pgmsg metrics-cost benchmark  N={args.n}  PostgreSQL {server} "
        f"(autovacuum={autovacuum})  {os.cpu_count()} cores  "
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}  load {os.getloadavg()[0]:.1f}  "
        f"{args.reps} rounds (min / median / max)"
    )
    common.django_setup(url, "bench.settings")
    os.environ.setdefault("BENCH_HANDLED_DIR", tempfile.mkdtemp())
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    ratios: dict[str, list[float]] = {mode: [] for mode in MODES}
    costs: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.reps):
        for mode in MODES:
            rate, cost = timed(url, mode, args.n)
            rates[mode].append(rate)
            costs[mode].append(cost)
        for mode in MODES:
            ratios[mode].append(rates[mode][-1] / rates["off"][-1])
    print(f"\n{'pgmsg Worker draining, metrics':<40} {'msg/s (min med max)':>29}  ratio to off")
    for mode in MODES:
        ratio = "" if mode == "off" else spread(ratios[mode], ".2f")
        print(f"{mode:<40} {spread(rates[mode])}  {ratio}")
    print(
        f"\n{'the instruments alone, per message':<40} {'microseconds (min med max)':>29}  "
        "share of a message's time in the off drain"
    )
    off_us = 1e6 / statistics.median(rates["off"])
    for mode in MODES:
        share = statistics.median(costs[mode]) / off_us
        print(f"{mode:<40} {spread(costs[mode], '>9.2f')}  {share:.1%} of {off_us:.0f} us")
    print(f"(load average at the end: {os.getloadavg()[0]:.1f})")
    off = statistics.median(rates["off"])
    for mode in MODES[1:]:
        summary.record(
            f"drain {args.n:,} with metrics {mode} (ratio column: to metrics off)",
            statistics.median(rates[mode]),
            off,
        )


if __name__ == "__main__":
    main()
