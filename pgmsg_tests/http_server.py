"""A real HTTP server in a thread, for the webhook tests: it records each request and answers
what the test tells it (``server.answer``), over kept-alive HTTP/1.1 connections."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RecordingServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        request = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}
        request["body"] = body
        status, text, delay = self.server.answer(request)
        if delay:
            time.sleep(delay)
        with self.server.lock:
            self.server.requests.append({**request, "status": status})
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # quiet
        pass


def accept_all(request: dict) -> tuple[int, str, float]:
    """The default answer: 200, at once."""
    return 200, "ok", 0.0


class RecordingServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, *, idle_timeout: float | None = None) -> None:
        handler = type("TimedHandler", (Handler,), {"timeout": idle_timeout})
        super().__init__(("127.0.0.1", 0), handler)
        self.port = self.server_address[1]
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.answer = accept_all
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name="http")
        self._thread.start()

    def url(self, path: str = "/hook", query: str = "") -> str:
        return f"http://127.0.0.1:{self.port}{path}" + (f"?{query}" if query else "")

    def payloads(self, status: int = 200) -> list:
        with self.lock:
            return [json.loads(r["body"]) for r in self.requests if r["status"] == status]

    def close(self) -> None:
        self.shutdown()
        self.server_close()
