"""A writer process of the follow-export test: appends events, optionally holding its first
transaction open until a file appears (a transaction that commits late).

    python -m pgmsg_tests.scripts.export_writer NAME COUNT [HOLD_UNTIL_FILE]
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    name, count = sys.argv[1], int(sys.argv[2])
    hold_until = sys.argv[3] if len(sys.argv) > 3 else None
    import django

    django.setup()
    from django.db import transaction

    from pgmsg.events import store
    from pgmsg_tests.testapp.events_handlers import Step

    written = 0
    if hold_until:
        with transaction.atomic():
            store.append(f"{name}-late", [Step(n=i, tag=name) for i in range(20)])
            print("holding", flush=True)
            while not os.path.exists(hold_until):
                time.sleep(0.05)
        written = 20
    while written < count:
        batch = min(5, count - written)
        store.append(f"{name}-{written % 7}", [Step(n=written + i, tag=name) for i in range(batch)])
        written += batch
        time.sleep(0.01)
    print("done", flush=True)


if __name__ == "__main__":
    main()
