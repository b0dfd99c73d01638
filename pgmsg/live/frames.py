"""Server-Sent Events messages (the text/event-stream format), encoded once per event.

An event's message is built once, as bytes, and the same object is queued for every client
that follows it: memory and encoding cost one message per event, not one per client.
"""

from __future__ import annotations

import json

#: The SSE event name of a message that stands in for an event too large to send.
SKIPPED = "pgmsg-skipped"
#: The SSE event name of a message that says why the server ended the stream.
CLOSING = "pgmsg-closing"


def message(data: str, *, id: str | None = None, event: str | None = None) -> bytes:
    """One SSE message; ``data`` may hold newlines (each line becomes a ``data:`` line)."""
    lines = []
    if event is not None:
        lines.append(f"event: {event}")
    if id is not None:
        lines.append(f"id: {id}")
    lines.extend(f"data: {line}" for line in data.split("\n"))
    return ("\n".join(lines) + "\n\n").encode()


def position(id: int) -> bytes:
    """A message with an id and no data: EventSource takes the id as its Last-Event-ID and
    fires no event (the SSE dispatch rules), so a reconnect resumes from there."""
    return f"id: {id}\n\n".encode()


def comment(text: str) -> bytes:
    """A comment line: ignored by EventSource, it keeps proxies and idle timers quiet."""
    return f": {text}\n\n".encode()


def retry(seconds: float) -> bytes:
    """The reconnection delay a browser uses after this stream ends."""
    return f"retry: {max(0, round(seconds * 1000))}\n\n".encode()


def closing(reason: str, *, retry_after: float) -> bytes:
    """The last message of a stream the server ends (slow client, shutdown): why, and when to
    come back (the browser reconnects with its Last-Event-ID and misses nothing)."""
    return retry(retry_after) + message(json.dumps({"reason": reason}), event=CLOSING)


def event_message(row: tuple, *, max_bytes: int) -> bytes:
    """An event's message: ``id`` its global position, ``data`` a JSON object with the
    position, stream, version, type, data and recorded_at (microseconds since the epoch);
    metadata stays on the server. Over ``max_bytes``, a SKIPPED message that names the event
    and says why: the client's Last-Event-ID moves past it all the same."""
    position, _xid, stream, _category, version, type_, data, recorded_at_us = row
    head = (
        f'{{"position": {position}, "stream": {json.dumps(stream)}, "version": {version}, '
        f'"type": {json.dumps(type_)}, "recorded_at_us": {recorded_at_us}, "data": '
    )
    # data is PostgreSQL's text of a jsonb value: valid JSON on one line, used as it is.
    encoded = message(head + data + "}", id=str(position))
    if len(encoded) <= max_bytes:
        return encoded
    reason = (
        f"the event's message is {len(encoded)} bytes, over PGMSG LIVE_MAX_EVENT_BYTES "
        f"({max_bytes}): read it with pgmsg.read_stream({stream!r}, start={version}, limit=1)"
    )
    return message(
        head + f'null, "reason": {json.dumps(reason)}}}', id=str(position), event=SKIPPED
    )
