"""A small blocking Server-Sent Events client over a raw socket, for the live tests.

Raw, so that a test controls the socket: read part of a message and hang up, or stop reading
(a slow client). It speaks HTTP/1.1: a Content-Length body (errors) or a chunked one (the
stream).
"""

from __future__ import annotations

import json
import socket
import time


class Closed(Exception):
    """The server ended the stream."""


class SseClient:
    def __init__(
        self,
        port: int,
        path: str,
        *,
        last_event_id: int | str | None = None,
        headers: dict | None = None,
        receive_buffer: int | None = None,
    ) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(30)
        self.sock.connect(("127.0.0.1", port))
        lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Accept: text/event-stream"]
        if last_event_id is not None:
            lines.append(f"Last-Event-ID: {last_event_id}")
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self._raw = b""
        self._text = ""
        self.ended = False
        self.status, self.headers = self._read_head()
        self.body = ""
        if "content-length" in self.headers:
            self.body = self._read_exact(int(self.headers["content-length"])).decode()
            self.ended = True
        elif self.status != 200:  # an error's body, chunked
            try:
                while True:
                    self._read_chunk()
            except Closed:
                self.body, self._text = self._text, ""
        #: Every message received: dicts with id, event, data (and retry for retry lines).
        self.messages: list[dict] = []
        self.comments: list[str] = []
        self.retry: int | None = None
        #: As EventSource keeps it: the last id field seen, with or without data.
        self.last_event_id: str | None = None

    # -- HTTP ------------------------------------------------------------------------------

    def _recv(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise Closed("the server closed the connection")
        self._raw += data

    def _read_head(self) -> tuple[int, dict]:
        while b"\r\n\r\n" not in self._raw:
            self._recv()
        head, self._raw = self._raw.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode().split("\r\n")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(status_line.split()[1]), headers

    def _read_exact(self, n: int) -> bytes:
        while len(self._raw) < n:
            self._recv()
        data, self._raw = self._raw[:n], self._raw[n:]
        return data

    def _read_chunk(self) -> None:
        while b"\r\n" not in self._raw:
            self._recv()
        size_line, self._raw = self._raw.split(b"\r\n", 1)
        size = int(size_line.split(b";")[0], 16)
        data = self._read_exact(size + 2)[:size]
        if size == 0:
            self.ended = True
            raise Closed("the stream ended")
        self._text += data.decode()

    # -- SSE -------------------------------------------------------------------------------

    def next_message(self, timeout: float = 30.0) -> dict:
        """The next message (comments and retry lines are recorded on the way)."""
        deadline = time.monotonic() + timeout
        while True:
            while "\n\n" in self._text:
                block, self._text = self._text.split("\n\n", 1)
                message = self._parse(block)
                if message:
                    self.messages.append(message)
                    return message
            if self.ended:
                raise Closed("the stream ended")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no message from the live endpoint")
            self.sock.settimeout(remaining)
            self._read_chunk()

    def _parse(self, block: str) -> dict | None:
        message: dict = {}
        data = []
        for line in block.split("\n"):
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "":
                self.comments.append(value)
            elif field == "retry":
                self.retry = int(value)
            elif field == "data":
                data.append(value)
            elif field in ("id", "event"):
                message[field] = value
                if field == "id":
                    self.last_event_id = value
        if not data:
            return None
        message["data"] = "\n".join(data)
        return message

    def events(self, count: int, timeout: float = 30.0) -> list[dict]:
        """The next ``count`` messages' data, decoded."""
        return [json.loads(self.next_message(timeout)["data"]) for _ in range(count)]

    def rest(self, timeout: float = 30.0) -> list[dict]:
        """Every message until the server ends the stream."""
        got = []
        while True:
            try:
                got.append(self.next_message(timeout))
            except Closed:
                return got

    def close(self) -> None:
        self.sock.close()
