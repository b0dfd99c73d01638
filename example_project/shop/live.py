"""The shop's live order feed: a page whose EventSource follows the "order" category, and
the uvicorn server that ``manage.py demo --live`` starts for it."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from django.core.management.base import CommandError
from django.http import HttpResponse

from pgmsg import live


def anyone(request, ask) -> bool:
    """The demo's feed is public; a real shop would check ``request.user`` here."""
    return True


ROOT = Path(__file__).resolve().parents[2]

#: /live/orders: the order events, as Server-Sent Events (docs/live.md).
order_feed = live.stream(categories=["order"], authorize=anyone)

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Orders, live</title>
<style>
body { font: 15px system-ui, sans-serif; margin: 2em; }
li { padding: .2em 0; } #state { color: #666; }
</style></head>
<body><h1>Orders, live</h1>
<p id="state">connecting...</p>
<ol id="orders" reversed></ol>
<script>
const state = document.getElementById("state");
const orders = document.getElementById("orders");
const source = new EventSource("orders");
source.onopen = () => { state.textContent = "live: new orders appear at the top"; };
source.onerror = () => { state.textContent = "disconnected: reconnecting (nothing is missed)"; };
source.onmessage = (message) => {
  const event = JSON.parse(message.data);
  const item = document.createElement("li");
  item.textContent = `${event.stream}: ${event.data.customer}, ${event.data.total}`;
  orders.prepend(item);
};
</script></body></html>
"""


def page(request):
    """/live/: the page that shows the feed."""
    return HttpResponse(PAGE)


def start_live_page(say, *, port: int) -> tuple[subprocess.Popen, str]:
    """uvicorn serving example_project.asgi (the live order feed at /live/), once it listens."""
    try:
        import uvicorn  # noqa: F401
    except ImportError:
        raise CommandError("--live needs uvicorn: pip install -e '.[live]'") from None
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "example_project.asgi:application",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=dict(os.environ),
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise CommandError(f"uvicorn exited with code {server.returncode} (port {port} taken?)")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        server.kill()
        raise CommandError(f"uvicorn did not listen on port {port} within 60 s")
    url = f"http://127.0.0.1:{port}/live/"
    say(f"   live order feed: {url} (open it in a browser; served by uvicorn, pid {server.pid})")
    return server, url
