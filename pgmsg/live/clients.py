"""One live client: what it asked for, where it stands, and its bounded buffer."""

from __future__ import annotations

import asyncio
import collections

import pgmsg.live.frames as frames
from pgmsg.live.asks import Ask

#: Why the hub let go of a client (the reason its stream's last message gives).
SLOW = "slow client: its buffer of events was full; reconnect to resume from the store"
SHUTDOWN = "the server is shutting down; reconnect to resume"

#: The comment line sent to a client that was sent nothing for a heartbeat interval.
HEARTBEAT = frames.comment("heartbeat")


class Client:
    """A browser's stream: the hub offers it messages, its response takes them.

    ``checkpoint`` is the read-order key (transaction id, position) of the last event it was
    given; while it catches up from the store the hub offers it nothing, and once it is in
    step the hub offers it each new event that sorts after its checkpoint.
    """

    __slots__ = ("ask", "checkpoint", "dropped", "frames", "limit", "ready", "sent")

    def __init__(self, ask: Ask, *, limit: int, checkpoint: tuple[int, int] | None) -> None:
        self.ask = ask
        self.limit = limit
        self.checkpoint = checkpoint
        self.frames: collections.deque[bytes] = collections.deque()
        self.ready = asyncio.Event()
        #: Set (to a reason) when the hub lets go of the client: its stream then ends.
        self.dropped: str | None = None
        #: Whether it was sent something since the hub's last heartbeat tick.
        self.sent = True

    def offer(self, frame: bytes) -> bool:
        """Queue ``frame``; False (and the client is dropped) when its buffer is full: what it
        holds is thrown away, and it resumes from the store by its Last-Event-ID."""
        if self.dropped is not None:
            return False
        if len(self.frames) >= self.limit:
            self.end(SLOW)
            return False
        self.frames.append(frame)
        self.ready.set()
        return True

    def beat(self) -> None:
        """A heartbeat if nothing was sent since the last tick (hub.py's heartbeat loop)."""
        if not self.sent and not self.frames and self.dropped is None:
            self.frames.append(HEARTBEAT)
            self.ready.set()
        self.sent = False

    def end(self, reason: str) -> None:
        self.dropped = reason
        self.frames.clear()
        self.ready.set()

    def take(self) -> bytes:
        """Everything queued, as one chunk (b"" when nothing is)."""
        self.ready.clear()
        if not self.frames:
            return b""
        chunk = b"".join(self.frames)
        self.frames.clear()
        self.sent = True
        return chunk
