"""What one client asks the live endpoint for, read from its request and checked."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from django.http import HttpRequest

from pgmsg.core import errors
from pgmsg.events import names

_POSITION_RE = re.compile(r"^[0-9]{1,18}$")


class Refused(Exception):
    """A request the endpoint answers with an HTTP error (the status and a reason)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Ask:
    """One client's request, as the authorization hook sees it.

    Events: ``categories`` (None: every category), or one ``stream``, and optionally
    ``types``; ``last_event_id`` is the position of the last event it has (None: start now).
    A broadcast channel: ``channel`` alone (delivery is best-effort, with no ids).
    """

    categories: frozenset[str] | None = None
    stream: str | None = None
    types: frozenset[str] | None = None
    channel: str | None = None
    last_event_id: int | None = None

    @property
    def category(self) -> str | None:
        """The one category asked for, if there is one."""
        if self.categories is not None and len(self.categories) == 1:
            return next(iter(self.categories))
        return None

    def wants(self, stream: str, category: str, type_: str) -> bool:
        """Whether an event of this stream, category and type goes to this client."""
        return (
            (self.categories is None or category in self.categories)
            and (self.stream is None or stream == self.stream)
            and (self.types is None or type_ in self.types)
        )


def read(
    request: HttpRequest,
    arguments: Mapping[str, str],
    *,
    categories: frozenset[str] | None,
    channels: frozenset[str],
) -> Ask:
    """The Ask of ``request`` (query string, and the URL's arguments, which win), checked
    against what the view serves; raises Refused (400 or 404) saying what is wrong."""
    channel, category, stream = (
        _one(request, arguments, name) for name in ("channel", "category", "stream")
    )
    types = request.GET.getlist("type") or ([arguments["type"]] if "type" in arguments else [])
    if channel is not None:
        return _channel_ask(channel, channels, filtered=bool(category or stream or types))
    if categories is not None and not categories:
        raise Refused(400, f"ask for a channel: one of {sorted(channels)}")
    category = _category(category, stream, served=categories)
    bad = [t for t in types if not names.is_type_name(t)]
    if bad:
        raise Refused(400, f"invalid event type name {bad[0]!r}")
    return Ask(
        categories=frozenset([category]) if category is not None else categories,
        stream=stream,
        types=frozenset(types) if types else None,
        last_event_id=_last_event_id(request),
    )


def _one(request: HttpRequest, arguments: Mapping[str, str], name: str) -> str | None:
    """``name``'s value: the URL's argument, else the query string's (given once at most)."""
    if name in arguments:
        return str(arguments[name])
    values = request.GET.getlist(name)
    if len(values) > 1:
        raise Refused(400, f"give {name!r} once, not {len(values)} times")
    return values[0] if values else None


def _channel_ask(channel: str, channels: frozenset[str], *, filtered: bool) -> Ask:
    if filtered:
        raise Refused(400, "a channel takes no category, stream or type filter")
    if channel not in channels:
        raise Refused(404, f"no live channel named {channel!r} here")
    return Ask(channel=channel)


def _category(
    category: str | None, stream: str | None, *, served: frozenset[str] | None
) -> str | None:
    """The category asked for (a stream's own), checked: well formed and served here."""
    if category is not None and stream is not None:
        raise Refused(400, "ask for a category or a stream, not both")
    try:
        if stream is not None:
            names.validate_stream_name(stream)
            category = names.category_of(stream)
        if category is not None:
            names.validate_category(category)
    except errors.InvalidStreamName as exc:
        raise Refused(400, str(exc)) from None
    if category is not None and served is not None and category not in served:
        raise Refused(404, f"no live category {category!r} here")
    return category


def _last_event_id(request: HttpRequest) -> int | None:
    """The Last-Event-ID header (an EventSource sends it when it reconnects), or the
    ``last_event_id`` query parameter for a first connection that resumes."""
    value = request.headers.get("Last-Event-ID")
    if value is None:
        value = request.GET.get("last_event_id")
    if value is None or value == "":
        return None
    value = value.strip()
    if not _POSITION_RE.match(value):
        raise Refused(
            400, f"Last-Event-ID {value[:40]!r} is not an event position (a whole number >= 0)"
        )
    return int(value)
