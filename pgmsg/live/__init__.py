"""Live: the event store and broadcast channels streamed to browsers as Server-Sent Events,
from one PostgreSQL LISTEN connection per server process (docs/live.md).

Mount ``pgmsg.live.stream(...)`` in a urlconf and serve the project with an ASGI server; wrap
the ASGI application in ``pgmsg.live.asgi(...)`` so that open streams cost no Django request.
"""

from __future__ import annotations

from pgmsg.live.asgi import asgi
from pgmsg.live.asks import Ask
from pgmsg.live.views import stream

__all__ = ["Ask", "asgi", "stream"]
