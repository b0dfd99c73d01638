"""A producer process for the duplicate-delivery storm: receives the same ids as its peers.

``python -m pgmsg_tests.scripts.inbox_producer SEED COUNT START_AT MODE`` receives message ids
0..COUNT-1 in an order shuffled by SEED, starting at the epoch time START_AT (so that peers
start together), one receive() per id (MODE "single") or receive_many() of 10 (MODE "many").
Prints how many it stored, as JSON.
"""

import json
import os
import random
import sys
import time

import django


def main() -> None:
    seed, count, start_at, mode = (
        int(sys.argv[1]),
        int(sys.argv[2]),
        float(sys.argv[3]),
        sys.argv[4],
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pgmsg_tests.settings")
    django.setup()
    import pgmsg

    ids = [f"storm-{i}" for i in range(count)]
    random.Random(seed).shuffle(ids)
    time.sleep(max(0.0, start_at - time.time()))
    stored = 0
    if mode == "single":
        for message_id in ids:
            stored += pgmsg.receive(
                "test.inbox", message_id, type="work", payload={"by": seed}
            ).stored
    else:
        for start in range(0, len(ids), 10):
            results = pgmsg.receive_many(
                "test.inbox",
                [
                    {"message_id": m, "type": "work", "payload": {"by": seed}}
                    for m in ids[start : start + 10]
                ],
            )
            stored += sum(r.stored for r in results)
    print(json.dumps({"stored": stored}))


if __name__ == "__main__":
    main()
