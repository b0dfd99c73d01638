"""``pgmsg.live.asgi(application)``: live streams that outlive Django's request handling.

Django keeps a request, its handler's tasks and its response for as long as a streaming
response runs: about 42 KB per open stream on uvicorn (a bare Django SSE view less a raw
ASGI one, docs/live.md). Wrapped, the live view
still runs inside Django (its middleware, sessions, the authorization hook), but once it lets a
client in it hands the stream to this wrapper: Django finishes the request and lets go of it,
and the wrapper writes the stream to the ASGI server itself. Without the wrapper the view
streams through Django, as any view does.
"""

from __future__ import annotations

import asyncio
import contextlib

from pgmsg.live.clients import Client

#: The scope key where the wrapper leaves a Handoff for the live view to fill.
SCOPE_KEY = "pgmsg.live"

#: Response headers that describe Django's body, not the stream the wrapper writes.
_DJANGO_BODY_HEADERS = frozenset({b"content-length", b"content-encoding"})

DISCONNECTED = "the client disconnected"


class Handoff:
    """Where the live view leaves the stream it lets a client have."""

    __slots__ = ("body", "client")

    def __init__(self) -> None:
        self.body = None
        self.client: Client | None = None

    def hand_over(self, body, client: Client) -> None:
        self.body, self.client = body, client


def asgi(application):
    """Wrap a Django ASGI application so that live streams are served outside Django's
    request handling (``application = pgmsg.live.asgi(get_asgi_application())``)."""

    async def live_or_django(scope, receive, send):
        if scope["type"] != "http":
            return await application(scope, receive, send)
        handoff = scope[SCOPE_KEY] = Handoff()

        async def send_until_handed_over(message):
            if handoff.body is None:
                return await send(message)
            if message["type"] == "http.response.start":
                headers = [
                    (name, value)
                    for name, value in message.get("headers", ())
                    if name.lower() not in _DJANGO_BODY_HEADERS
                ]
                return await send({**message, "headers": headers})
            # Django's body of a handed-over response is empty (or a middleware's wrapping of
            # nothing): the stream is written below.

        await application(scope, receive, send_until_handed_over)
        body, client = handoff.body, handoff.client
        del scope[SCOPE_KEY]
        if body is not None:
            await _stream(body, client, receive, send)

    return live_or_django


async def _stream(body, client: Client, receive, send) -> None:
    """Write ``body`` to the client until it ends or the client goes away: a disconnect ends
    the client, which ends the body (and takes the client off the hub)."""
    gone = False

    async def watch():
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        client.end(DISCONNECTED)

    watcher = asyncio.ensure_future(watch())
    try:
        async for chunk in body:
            if gone:
                break
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if not gone:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await body.aclose()
