"""The worker needs none of the optional extras: a project without `spark`, `outbox` or
`metrics` installed can still import and run `listen` for channels, inboxes and subscriptions.
(Periodic archiving once made every subscription worker import pyspark.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The extras' top-level modules (setup.cfg's extras_require).
EXTRAS = ["pyspark", "pyarrow", "matplotlib", "pika", "nats", "redis", "paho", "prometheus_client"]

PROGRAM = f"""
import sys
for name in {EXTRAS!r}:
    sys.modules[name] = None  # any import of it raises ImportError
import django
django.setup()
import pgmsg
from pgmsg.core import worker
from pgmsg.channels import serving, source
from pgmsg.inbox import model_source
from pgmsg.events import serving, source
from pgmsg.management.commands import listen
from pgmsg.core import instruments
assert not instruments.enabled()
print("imported without the extras")
"""


def test_the_worker_and_its_sources_import_without_any_extra():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "pgmsg_tests.settings"}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported without the extras" in done.stdout
