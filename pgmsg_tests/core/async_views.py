"""Async views served by Django's own ASGI handler in test_async_producers.py (its urlconf).

``checkout`` and ``place_order`` are docs/async.md's sample, executed from the document
itself (its ``shop`` imports pointed at the test app), so the page cannot drift from the test.
"""

from __future__ import annotations

import asyncio
import re
from decimal import Decimal

import psycopg
from django.db import connection
from django.http import JsonResponse
from django.urls import path

import pgmsg
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import ROOT
from pgmsg_tests.testapp.outbox_declarations import OrderPlaced

SAMPLE = re.search(
    r"```python\n(# shop/views\.py\n.*?)```", (ROOT / "docs/async.md").read_text(), re.S
)
assert SAMPLE, "docs/async.md has no `# shop/views.py` sample"
sample = SAMPLE.group(1)
sample = sample.replace("from shop.models import", "from pgmsg_tests.testapp.models import")
sample = sample.replace(
    "from shop.outbox import", "from pgmsg_tests.testapp.outbox_declarations import"
)
exec(compile(sample, "docs/async.md # shop/views.py", "exec"), globals())  # noqa: S102


def committed_elsewhere(message_id: str) -> int:
    """Outbox rows with this message id that a new connection sees: committed ones only."""
    with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as other:
        row = other.execute(
            "SELECT count(*) FROM pgmsg_outbox_message WHERE message_id = %s", [message_id]
        ).fetchone()
    return row[0]


async def publish_alone(request):
    """``await apublish()`` with no transaction around it: committed when it returns."""
    published = await pgmsg.apublish(OrderPlaced(order_id=1, total=Decimal("2.50")))
    seen = await asyncio.to_thread(committed_elsewhere, str(published.message_id))
    return JsonResponse({"message_id": str(published.message_id), "seen_elsewhere": seen})


urlpatterns = [
    path("checkout", checkout),  # noqa: F821  (defined by docs/async.md's sample)
    path("publish-alone", publish_alone),
]
