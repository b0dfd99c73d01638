"""Benchmark: concurrent producers of fresh, distinct ids, `receive()` and `publish()` at 1, 15
and 100 messages per transaction from 1 and 4 processes, counting deadlocks.

Each cell runs P producer processes for S seconds (default 3); every process calls
`pgmsg.receive()` (inbox test.inbox) or `pgmsg.publish()` (outbox test.recorded, keyless, no
relay running) once per message, M times per transaction, with ids of its own that no one
else uses. A transaction that fails with "deadlock detected" is counted and not retried (its
messages are not counted). The rate is the messages committed per second, all processes
together.

raw: the ceiling, measured in the same run: the same processes, one plain
`INSERT ... ON CONFLICT DO NOTHING` per message into an unpartitioned table with a unique
index on (inbox, message_id) and no trigger, M per transaction.

``--before PATH``: also run every pgmsg cell on the checkout at PATH (its own scratch database,
migrated by its own code), interleaved with this checkout's, so that both meet the same load
of the machine; the table gets a column for each.

    DATABASE_URL=postgres://... python bench/producers.py [--seconds 3] [--before PATH]

Scratch databases `pgmsg_bench_producers`, `..._before` and `..._raw` (dropped and re-created).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
#: The checkout whose pgmsg a producer process runs (--before's, or this one).
CODE = Path(os.environ.get("PGMSG_BENCH_CODE", ROOT))
sys.path.insert(0, str(CODE))

from bench import common  # noqa: E402

SCRATCH_DB = "pgmsg_bench_producers"
INBOX = "test.inbox"
OUTBOX = "test.recorded"
PER_TX = (1, 15, 100)
PROCESSES = (1, 4)
RAW_TABLE = """
CREATE TABLE IF NOT EXISTS bench_raw (
    id bigserial PRIMARY KEY, inbox text NOT NULL, message_id text NOT NULL,
    payload jsonb NOT NULL, UNIQUE (inbox, message_id)
)
"""
RAW_INSERT = (
    "INSERT INTO bench_raw (inbox, message_id, payload) VALUES (%s, %s, '{}') "
    "ON CONFLICT DO NOTHING"
)


def producer(args: argparse.Namespace) -> None:
    """One producer process: writes until the cell's end, prints its counts as JSON."""
    messages = transactions = deadlocks = 0
    n = 0
    if args.mode == "raw":
        conn = psycopg.connect(os.environ["DATABASE_URL"])
        args.start_at = ready()
        while time.time() < args.start_at + args.seconds:
            with conn.transaction():
                for _ in range(args.per_tx):
                    conn.execute(RAW_INSERT, [INBOX, f"{args.prefix}-{n}"])
                    n += 1
            messages += args.per_tx
            transactions += 1
    else:
        common.django_setup(os.environ["DATABASE_URL"], migrate=False)
        from django.db import DatabaseError, transaction

        import pgmsg

        if args.mode == "receive":

            def write(message_id: str) -> None:
                pgmsg.receive(INBOX, message_id, type="work", payload={"n": 1})
        else:

            def write(message_id: str) -> None:
                pgmsg.publish(OUTBOX, {"n": 1}, type="t", message_id=message_id)

        write(f"{args.prefix}-warm")  # connect, prepare
        args.start_at = ready()
        while time.time() < args.start_at + args.seconds:
            try:
                with transaction.atomic():
                    for _ in range(args.per_tx):
                        write(f"{args.prefix}-{n}")
                        n += 1
            except DatabaseError as exc:
                if "deadlock detected" not in str(exc):
                    raise
                deadlocks += 1
                continue
            messages += args.per_tx
            transactions += 1
    print(json.dumps({"messages": messages, "transactions": transactions, "deadlocks": deadlocks}))


def ready() -> float:
    """Say so to the parent; wait for its start time (when every producer is ready)."""
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    time.sleep(max(0.0, start_at - time.time()))
    return start_at


def run_cell(root: Path, url: str, mode: str, per_tx: int, processes: int, seconds: float):
    """P producers of the checkout at ``root``: (messages/s, transactions, deadlocks)."""
    env = {**os.environ, "DATABASE_URL": url, "PGMSG_BENCH_CODE": str(root)}
    command = [sys.executable, __file__, "--producer", mode, "--per-tx", str(per_tx)]
    command += ["--seconds", str(seconds)]
    children = [
        subprocess.Popen(
            [*command, "--prefix", f"{mode}-{per_tx}-{processes}-{p}-{time.time_ns()}"],
            env=env,
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for p in range(processes)
    ]
    # Every producer has imported Django and connected before the cell starts.
    for child in children:
        assert child.stdout.readline().strip() == "ready"
    start_at = f"{time.time() + 0.2}\n"
    outputs = [child.communicate(start_at)[0] for child in children]
    if any(c.returncode for c in children):
        raise SystemExit(f"a producer of {mode} failed")
    counts = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    total = {k: sum(c[k] for c in counts) for k in counts[0]}
    return total["messages"] / seconds, total["transactions"], total["deadlocks"]


def migrate(root: Path, url: str) -> None:
    env = {**os.environ, "DATABASE_URL": url}
    code = (
        "import sys; sys.path.insert(0, '.'); from bench import common; "
        f"common.django_setup({url!r}, migrate=True)"
    )
    subprocess.run([sys.executable, "-c", code], env=env, cwd=root, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--before", type=Path, help="another checkout to measure alongside")
    parser.add_argument("--producer", choices=["raw", "receive", "publish"], dest="mode")
    parser.add_argument("--per-tx", type=int, default=1)
    parser.add_argument("--prefix", default="m")
    args = parser.parse_args()
    if args.mode:
        producer(args)
        return

    trees = {"after": ROOT}
    if args.before:
        trees = {"before": args.before.resolve(), "after": ROOT}
    urls = {}
    for label, root in trees.items():
        name = SCRATCH_DB if label == "after" else f"{SCRATCH_DB}_before"
        urls[label] = common.scratch_url(name)
        migrate(root, urls[label])
    raw_url = common.scratch_url(f"{SCRATCH_DB}_raw")
    with psycopg.connect(raw_url, autocommit=True) as conn:
        conn.execute(RAW_TABLE)

    print(f"{args.seconds:g} s per cell; rates in messages/s; ratio = pgmsg / raw")
    header = f"{'cell':<22}{'raw':>9}"
    for label in trees:
        header += f"{label:>10}{'ratio':>7}{'deadlk':>8}"
    print(header)
    for mode in ("receive", "publish"):
        for per_tx in PER_TX:
            for processes in PROCESSES:
                raw = run_cell(ROOT, raw_url, "raw", per_tx, processes, args.seconds)[0]
                line = f"{mode:<8}{per_tx:>4}/tx {processes}p{'':>3}{raw:>9,.0f}"
                for label, root in trees.items():
                    rate, txs, deadlocks = run_cell(
                        root, urls[label], mode, per_tx, processes, args.seconds
                    )
                    line += f"{rate:>10,.0f}{rate / max(raw, 1):>7.2f}"
                    line += f"{deadlocks:>4}/{txs + deadlocks:<4}"
                print(line, flush=True)


if __name__ == "__main__":
    main()
