"""The live endpoints of pgmsg_tests/live: open, guarded by a hook, and the default check."""

from __future__ import annotations

import asyncio

from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import path

from pgmsg import live
from pgmsg_tests.testapp.channels import Shout


def allow(request, ask) -> bool:
    return True


def guard(request, ask) -> bool:
    """Denies category "secret"; raises for category "boom" (a broken hook)."""
    if ask.category == "boom":
        raise RuntimeError("the hook broke")
    return ask.category != "secret"


urlpatterns = [
    path("events", live.stream(authorize=allow)),
    path("streams/<str:stream>", live.stream(authorize=allow)),
    path("guarded", live.stream(categories=["secret", "boom", "open"], authorize=guard)),
    path("default", live.stream(categories=["open"])),
    path("channels", live.stream(categories=(), channels=[Shout], authorize=allow)),
]


PAGE = """<!doctype html>
<html><head><title>live</title></head><body><ol id="received"></ol>
<script>
window.received = []; window.opens = 0; window.errors = 0;
const category = new URLSearchParams(location.search).get("category");
const source = new EventSource("/live/events?category=" + category);
source.onopen = () => { window.opens += 1; };
source.onerror = () => { window.errors += 1; };
source.onmessage = (message) => {
  const event = JSON.parse(message.data);
  window.received.push([Number(message.lastEventId), event.data.n]);
  const item = document.createElement("li");
  item.textContent = event.stream + " #" + event.data.n;
  document.getElementById("received").appendChild(item);
};
</script></body></html>
"""


async def bare(request):
    """Server-Sent Events with no pgmsg in them (a heartbeat a quarter hour): what Django and
    the ASGI server cost per client alone (bench/live.py's memory ceiling)."""

    async def body():
        yield b"retry: 2000\n\n"
        while True:
            await asyncio.sleep(900)
            yield b": heartbeat\n\n"

    response = StreamingHttpResponse(body(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    return response


def page(request):
    """A page whose EventSource follows ?category= (the browser test)."""
    return HttpResponse(PAGE)


async def hub_clients(request):
    """How many clients this server process's hub holds (tests: a client that went away is
    let go)."""
    from pgmsg.live.hub import Hub

    live_hub = Hub.get()
    held = len(live_hub.clients) + sum(len(s) for s in live_hub.channel_clients.values())
    return JsonResponse({"clients": held})


urlpatterns += [path("page", page), path("bare", bare), path("hub", hub_clients)]
