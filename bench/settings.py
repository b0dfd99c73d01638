"""Benchmark settings: the test settings plus the bench app, on DATABASE_URL."""

import os

from pgmsg_tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench.benchapp"]  # noqa: F405
LOGGING = {"version": 1, "disable_existing_loggers": False}
# The documented defaults, and the brokers of this machine (from the test settings) with the
# webhook destination's secret (without it, manage.py check stops every listen: pgmsg.E501).
PGMSG = {
    "OUTBOX_DESTINATIONS": OUTBOX_DESTINATIONS,  # noqa: F405
    "OUTBOX_HTTP_SECRETS": PGMSG["OUTBOX_HTTP_SECRETS"],  # noqa: F405
}
# BENCH_PREPARE_THRESHOLD=5: Django's OPTIONS prepare_threshold (psycopg's prepared statements,
# off by default in Django), to measure notify() with them (bench/notify_cost.py).
if os.environ.get("BENCH_PREPARE_THRESHOLD"):
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = int(  # noqa: F405
        os.environ["BENCH_PREPARE_THRESHOLD"]
    )
# BENCH_IDLE_AFTER=0.0001 (it must be positive): PGMSG IDLE_AFTER (how long a busy worker keeps
# looking before it declares itself idle), to measure what lingering costs a worker.
if os.environ.get("BENCH_IDLE_AFTER"):
    PGMSG["IDLE_AFTER"] = float(os.environ["BENCH_IDLE_AFTER"])
# BENCH_BRIDGES: PGMSG INBOX_BRIDGES (a JSON object) for the listen processes of
# bench/bridges.py.
if os.environ.get("BENCH_BRIDGES"):
    import json

    PGMSG["INBOX_BRIDGES"] = json.loads(os.environ["BENCH_BRIDGES"])
