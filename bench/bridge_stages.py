"""Where a bridge's drain spends its time: bench/bridges.py's throughput part for one broker,
with the time inside each step of the bridge summed over the drain.

    python bench/bridge_stages.py amqp [--n 5000]

Prints the raw and bridge rates (as bench/bridges.py does, one round), then seconds in: the
worker's whole drain (wall, from its start until the inbox holds N), process_batch (one
batch: fetch, store, ack), store (receive_many() and the commit), receive_many() alone,
mapping.convert() alone, the consumer's fetch and its ack. A consumer that fetches ahead
(Redis Streams, pgmsg/inbox/bridges/prefetch.py) maps, fetches and acknowledges on a second
thread, beside the store: those three then overlap the rest instead of adding to it. The
timers wrap the functions by monkeypatching, in this process only.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import bridges  # noqa: E402

spent: collections.Counter[str] = collections.Counter()


def timed(owner, name: str, label: str) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("broker", choices=sorted(bridges.RAW))
    parser.add_argument("--n", type=int, default=5_000)
    args = parser.parse_args()
    drain = bridges.bridge_rate

    def instrumented(*a):
        from pgmsg.inbox.bridges import amqp, mapping, mqtt, nats, redis, source

        timed(source.BridgeSource, "process_batch", "process_batch")
        timed(source.BridgeSource, "_store", "store (receive_many, commit)")
        timed(source.inbox, "receive_many", "receive_many")
        timed(mapping, "convert", "mapping.convert")
        for consumer in (amqp.AmqpConsumer, redis.RedisConsumer, nats.NatsConsumer):
            timed(consumer, "fetch", "fetch")
            timed(consumer, "ack", "ack")
        timed(mqtt.MqttConsumer, "fetch", "fetch")
        timed(mqtt.MqttConsumer, "ack", "ack")
        start = time.perf_counter()
        try:
            return drain(*a)
        finally:
            spent["wall"] = time.perf_counter() - start

    bridges.bridge_rate = instrumented
    sys.argv = [
        sys.argv[0],
        *("--brokers", args.broker, "--parts", "throughput", "--n", str(args.n), "--rounds", "1"),
    ]
    bridges.main()
    for label, seconds in spent.most_common():
        print(f"{label:<36} {seconds:.3f} s")


if __name__ == "__main__":
    main()
