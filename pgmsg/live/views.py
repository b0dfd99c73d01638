"""The live endpoint: ``stream(...)`` makes the async view a project mounts in its urlconf."""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

import pgmsg.live.asks as asks
import pgmsg.live.clients as clients
import pgmsg.live.frames as frames
import pgmsg.live.hub as hub
import pgmsg.live.reads as reads
from pgmsg.channels import declarations
from pgmsg.core import conf, errors
from pgmsg.events import names
from pgmsg.live.asgi import SCOPE_KEY as HANDOFF_KEY
from pgmsg.live.asks import Ask, Refused
from pgmsg.live.clients import Client

logger = logging.getLogger(__name__)

#: ``authorize(request, ask)``: True lets the client in; it may be a coroutine function.
Authorize = Callable[[HttpRequest, Ask], bool | Awaitable[bool]]

#: The permissions the default authorization asks of a logged-in user.
EVENTS_PERMISSION = "pgmsg.view_storedevent"
CHANNELS_PERMISSION = "pgmsg.view_notification"

#: Seconds a new client waits for the hub to reach PostgreSQL before it is told to come back.
CONNECT_WAIT = 10.0


def stream(
    *,
    categories: Iterable[str] | None = None,
    channels: Iterable[type | str] = (),
    authorize: Authorize | None = None,
):
    """An async view that streams events and broadcast channels as Server-Sent Events.

    ``categories``: the event categories it serves, others are refused with 404 (None: any
    well-formed category, with or without events yet; empty: none, for channels only).
    ``channels``: the broadcast channels it serves (declared classes or names).
    ``authorize(request, ask)``: who may follow what; by default a logged-in user with
    pgmsg.view_storedevent (events) or pgmsg.view_notification (channels). Clients choose with
    the query string: ``?category=``, ``?stream=``, ``?type=`` (repeat it), ``?channel=``,
    or the same names as arguments of the URL pattern. docs/live.md.
    """
    served = (
        None if categories is None else frozenset(names.validate_category(c) for c in categories)
    )
    channel_names = frozenset(_channel_name(c) for c in channels)
    hub.wanted_channels.update(declarations.BROADCAST_PREFIX + name for name in channel_names)
    check = authorize or _may_read

    async def live_stream(request: HttpRequest, **arguments) -> HttpResponse:
        if not hasattr(request, "scope"):
            return _plain(
                500, "pgmsg.live needs an ASGI server (uvicorn, daphne): see docs/live.md"
            )
        try:
            ask = asks.read(request, arguments, categories=served, channels=channel_names)
        except Refused as refused:
            return _plain(refused.status, refused.reason)
        try:
            allowed = check(request, ask)
            if inspect.isawaitable(allowed):
                allowed = await allowed
        except Exception:
            logger.exception("pgmsg live: the authorization hook raised for %s", request.path)
            return _plain(500, "the live endpoint's authorization hook failed; see the server log")
        if allowed is not True:
            return _plain(403, "forbidden")
        live = hub.Hub.get()
        try:
            await live.ready(CONNECT_WAIT)
            checkpoint = await _where_to_start(live, ask, served)
        except Refused as refused:
            return _plain(refused.status, refused.reason)
        except hub.Unavailable as exc:
            # Not a 503: EventSource gives up for good on an error status. A stream that
            # ends at once with a retry hint makes the browser come back and resume.
            return _events(_come_back_later(str(exc)))
        client = Client(ask, limit=conf.get().LIVE_CLIENT_BUFFER, checkpoint=checkpoint)
        handoff = request.scope.get(HANDOFF_KEY)
        if handoff is None:
            return _events(_body(live, client))
        # Served by pgmsg.live.asgi: Django answers with the headers and lets go of the
        # request; the wrapper writes the stream.
        handoff.hand_over(_body(live, client), client)
        return _events(_nothing())

    return live_stream


def _channel_name(channel: type | str) -> str:
    if isinstance(channel, str):
        return channel
    spec = getattr(channel, "pgmsg_channel", None)
    if not isinstance(spec, declarations.ChannelSpec):
        raise errors.ConfigurationError(f"{channel!r} is not a declared pgmsg.Channel")
    if spec.delivery != declarations.BROADCAST:
        raise errors.ConfigurationError(
            f"channel {spec.name!r} is exactly-once (its messages go to one worker each); "
            "pgmsg.live serves broadcast channels: declare it with delivery=pgmsg.BROADCAST"
        )
    return spec.name


async def _may_read(request: HttpRequest, ask: Ask) -> bool:
    user = await request.auser()
    permission = CHANNELS_PERMISSION if ask.channel else EVENTS_PERMISSION
    return user.is_authenticated and await user.ahas_perm(permission)


async def _where_to_start(
    live: hub.Hub, ask: Ask, served: frozenset[str] | None
) -> tuple[int, int] | None:
    """The checkpoint a client resumes after: its Last-Event-ID's, else the newest event's
    (None for a broadcast channel: from now); refuses an unknown stream or category, and a
    Last-Event-ID that names no stored event."""
    if ask.channel is not None:
        return None
    if ask.stream is not None and not await live.query(reads.stream_exists, ask.stream):
        raise Refused(404, f"no stream named {ask.stream!r}")
    if ask.last_event_id is None:
        return await live.query(reads.newest)  # and its position is the client's first id
    if ask.last_event_id == 0:
        return (0, 0)  # from the first event
    xid, last = await live.query(reads.checkpoint_of, ask.last_event_id)
    if xid is not None:
        return (xid, ask.last_event_id)
    if ask.last_event_id > last:
        raise Refused(
            400, f"Last-Event-ID {ask.last_event_id} is after the store's last event ({last})"
        )
    raise Refused(
        400,
        f"Last-Event-ID {ask.last_event_id}: no stored event has that position (archived, or "
        "never committed); reconnect without it, or with 0 to read from the first event",
    )


async def _body(live: hub.Hub, client: Client):
    """The stream: the retry hint, what the client missed, then each new event as it comes,
    with heartbeats in the silences; a last message that says why when the server ends it."""
    settings = conf.get()
    yield frames.retry(settings.LIVE_RETRY)
    if client.ask.channel is None and client.ask.last_event_id is None:
        yield frames.position(client.checkpoint[1])
    try:
        if client.checkpoint is None:
            live.join(client)
        else:
            while True:
                try:
                    async for chunk in live.catch_up(client):
                        yield chunk
                    break
                except hub.Unavailable:
                    if live.closed:
                        client.end(clients.SHUTDOWN)
                        break
                    yield frames.comment("waiting for PostgreSQL")
                    with contextlib.suppress(hub.Unavailable):
                        await live.ready(settings.LIVE_HEARTBEAT)
        while True:
            if client.dropped is None and not client.frames:
                await client.ready.wait()  # an event, a heartbeat (the hub's), or the end
            chunk = client.take()
            if chunk:
                yield chunk
            if client.dropped is not None:
                yield frames.closing(client.dropped, retry_after=settings.LIVE_RETRY)
                return
    finally:
        live.leave(client)


def _events(body) -> StreamingHttpResponse:
    response = StreamingHttpResponse(body, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each message on at once
    return response


async def _nothing():
    return
    yield


async def _come_back_later(reason: str):
    yield frames.closing(reason, retry_after=conf.get().LIVE_RETRY)


def _plain(status: int, text: str) -> HttpResponse:
    return HttpResponse(text + "\n", status=status, content_type="text/plain; charset=utf-8")
