"""The benchmark's channels: bench.tick, whose listener notes that seq was handled and when
(the exactly-once check of multi-process runs), and bench.drain, whose listener only counts
(the no-op listener of the in-process drains, next to a raw worker that only parses JSON)."""

import os
import time

import pgmsg


class Tick(pgmsg.Channel, name="bench.tick"):
    seq: int
    ts: float = 0.0


_fd = None


@pgmsg.listener(Tick)
def record(message: Tick) -> None:
    global _fd
    now = time.time()
    if _fd is None:
        path = os.path.join(os.environ["BENCH_HANDLED_DIR"], f"h-{os.getpid()}.log")
        _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    # "seq handled-at" is the line format of ../shared/bench-peers; with a producer timestamp
    # (bench/notifications.py latency runs) a third field carries it.
    line = f"{message.seq} {now:.6f}" + (f" {message.ts:.6f}" if message.ts else "")
    os.write(_fd, (line + "\n").encode())


class Drained(pgmsg.Channel, name="bench.drain"):
    seq: int
    ts: float = 0.0


#: Messages of bench.drain handled by this process.
drained = 0


@pgmsg.listener(Drained)
def count(message: Drained) -> None:
    global drained
    drained += 1
