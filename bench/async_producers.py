"""Benchmark: `await pgmsg.anotify()` against `notify()` and psycopg's AsyncConnection, and what
an `async def` listener costs the worker per message.

Producers, one transaction per call (autocommit: no atomic block, as in an async view), for
``--seconds`` per cell, in one process:

- sync: `pgmsg.notify(Work(...))` in a loop;
- async: `await pgmsg.anotify(Work(...))` in a loop (asgiref's thread-sensitive thread);
- native: the statement notify() sends (send_prepared), awaited on a psycopg AsyncConnection,
  prepared: the best a native async path of pgmsg's own could do;
- raw: a plain `INSERT` of one row into an unindexed table on an AsyncConnection: the ceiling;

each with 1 caller, then 8 concurrent callers (8 tasks, each in its own
ThreadSensitiveContext as 8 ASGI requests are, against 8 AsyncConnections for native and raw).

Listeners: in one transaction, as the worker runs a batch, the cost per message of a sync
handler doing `Effect.objects.create()` against an `async def` one doing `await
Effect.objects.acreate()` (run through core/asynchrony.in_worker_thread: async_to_sync), and of
an empty async handler against an empty sync one (and, for docs/decisions.md, against the same
handler sent to one loop kept per worker, the alternative not adopted).

    python bench/async_producers.py [--seconds 2]

Uses DATABASE_URL's server (or the embedded one) and a scratch database it drops and re-creates.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402

SCRATCH_DB = "pgmsg_bench_async"
CONCURRENCY = 8
RAW_TABLE = "CREATE TABLE IF NOT EXISTS bench_raw (id bigserial, channel text, payload text)"
RAW_INSERT = "INSERT INTO bench_raw (channel, payload) VALUES (%s, %s)"
_keys = itertools.count()


def sync_rate(seconds: float) -> float:
    import pgmsg
    from pgmsg_tests.testapp.channels import Work

    done, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        pgmsg.notify(Work(key=f"s{next(_keys)}"))
        done += 1
    return done / seconds


async def async_rate(seconds: float, callers: int) -> float:
    from asgiref.sync import ThreadSensitiveContext

    import pgmsg
    from pgmsg_tests.testapp.channels import Work

    end = time.perf_counter() + seconds

    async def caller() -> int:
        done = 0
        async with ThreadSensitiveContext():  # one thread and connection per caller
            while time.perf_counter() < end:
                await pgmsg.anotify(Work(key=f"a{next(_keys)}"))
                done += 1
        return done

    return sum(await asyncio.gather(*(caller() for _ in range(callers)))) / seconds


async def psycopg_rate(url: str, seconds: float, callers: int, *, native: bool) -> float:
    from pgmsg.channels.sending import QUERIES

    end = time.perf_counter() + seconds

    async def caller() -> int:
        done = 0
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            while time.perf_counter() < end:
                payload = f'{{"key": "n{next(_keys)}"}}'
                if native:
                    params = {"channel": "test.work", "payload": payload}
                    await conn.execute(QUERIES["send_prepared"], params, prepare=True)
                else:
                    await conn.execute(RAW_INSERT, ["test.work", payload], prepare=True)
                done += 1
        return done

    return sum(await asyncio.gather(*(caller() for _ in range(callers)))) / seconds


async def hop_us(calls: int) -> float:
    """Microseconds per ``await`` of a thread-sensitive no-op: what anotify() adds to notify()."""
    from asgiref.sync import ThreadSensitiveContext, sync_to_async

    hop = sync_to_async(lambda: None, thread_sensitive=True)
    async with ThreadSensitiveContext():
        await hop()
        started = time.perf_counter()
        for _ in range(calls):
            await hop()
        return (time.perf_counter() - started) / calls * 1e6


def per_message_us(handler, messages: int) -> float:
    """Microseconds per call of ``handler`` as the worker calls it, in one transaction."""
    from django.db import transaction

    from pgmsg.core import asynchrony

    run = asynchrony.in_worker_thread(handler)
    with transaction.atomic():
        run(0)  # warm: connection, first statement
        started = time.perf_counter()
        for n in range(messages):
            run(n)
        elapsed = time.perf_counter() - started
        transaction.set_rollback(True)
    return elapsed / messages * 1e6


def listener_costs(messages: int) -> list[tuple[str, float]]:
    from pgmsg_tests.testapp.models import Effect

    def sync_write(n: int) -> None:
        Effect.objects.create(channel="bench", key=str(n))

    async def async_write(n: int) -> None:
        await Effect.objects.acreate(channel="bench", key=str(n))

    def sync_empty(n: int) -> None:
        pass

    async def async_empty(n: int) -> None:
        pass

    costs = [
        (name, per_message_us(handler, messages))
        for name, handler in [
            ("sync, empty", sync_empty),
            ("async def, empty", async_empty),
            ("sync, Effect.objects.create()", sync_write),
            ("async def, await Effect.objects.acreate()", async_write),
        ]
    ]
    with one_loop_per_worker():
        costs.append(
            ("async def, empty, one loop per worker", per_message_us(async_empty, messages))
        )
    return costs


@contextlib.contextmanager
def one_loop_per_worker():
    """The alternative not adopted (docs/decisions.md): async_to_sync sent to one loop kept
    running in a thread, through asgiref's private threadlocal, instead of a new loop per call."""
    from asgiref.sync import SyncToAsync

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    local = SyncToAsync.threadlocal
    local.main_event_loop, local.main_event_loop_pid = loop, os.getpid()
    try:
        yield
    finally:
        del local.main_event_loop, local.main_event_loop_pid
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--messages", type=int, default=2000)
    args = parser.parse_args()
    url = common.scratch_url(SCRATCH_DB)
    common.django_setup(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(RAW_TABLE)
    sync_rate(0.2)  # warm: connect, prepare

    print(
        f"producers: calls/s, one transaction each; median of {args.reps} interleaved "
        f"{args.seconds:g} s cells"
    )
    print(
        f"{'callers':<9}{'sync':>9}{'async':>9}{'native':>9}{'raw':>9}"
        f"{'async/sync':>12}{'async/native':>14}{'async/raw':>11}"
    )
    for callers in (1, CONCURRENCY):
        cells: dict[str, list[float]] = {"sync": [], "async": [], "native": [], "raw": []}
        for _ in range(args.reps):
            if callers == 1:  # sync code in one thread has one connection: one caller
                cells["sync"].append(sync_rate(args.seconds))
            cells["async"].append(asyncio.run(async_rate(args.seconds, callers)))
            for kind in ("native", "raw"):
                rate = psycopg_rate(url, args.seconds, callers, native=kind == "native")
                cells[kind].append(asyncio.run(rate))
        sync, async_, native, raw = (
            statistics.median(v) if v else float("nan") for v in cells.values()
        )
        print(
            f"{callers:<9}{sync:>9,.0f}{async_:>9,.0f}{native:>9,.0f}{raw:>9,.0f}"
            f"{async_ / sync:>12.2f}{async_ / native:>14.2f}{async_ / raw:>11.2f}",
            flush=True,
        )
    hops = [asyncio.run(hop_us(args.messages)) for _ in range(args.reps)]
    print(f"the hop alone (await sync_to_async(no-op)): {statistics.median(hops):.0f} us per call")

    print(f"\nlisteners: us per message in one transaction, median of {args.reps} runs")
    runs = [dict(listener_costs(args.messages)) for _ in range(args.reps)]
    for name in runs[0]:
        print(f"  {name:<44}{statistics.median(r[name] for r in runs):>8.0f}")


if __name__ == "__main__":
    main()
