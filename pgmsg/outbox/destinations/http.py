"""HTTP(S) webhooks through the standard library: one signed POST per message, its JSON payload
as the body, over connections kept alive per relay.

URL: ``https://host/path?query`` (``http://`` for tests and private networks). pgmsg's options,
taken out of the URL: ``secret`` (the signing secret; better in PGMSG OUTBOX_HTTP_SECRETS under
the destination's name, which it overrides), ``timeout`` (seconds for the connection and each
read; default PGMSG OUTBOX_PUBLISH_TIMEOUT) and ``concurrency`` (requests in flight at once
per relay, each on its own kept-alive connection; default 8; 1 posts one after another).

Headers: pgmsg's (``pgmsg-message-id``, ``pgmsg-type``, ``pgmsg-outbox``, ``pgmsg-key``,
``pgmsg-redelivery-count``, ``pgmsg-topic``), the producer's, and the signature of
core/signatures.py (``pgmsg-timestamp``, ``pgmsg-signature: v1=<hex>``).

Answers: 2xx confirms. 408, 429 and 5xx say the receiver cannot take it now, and a timeout or a
lost connection says nothing: BrokerUnavailable (the message is kept, no attempt counted, the
relay backs off). Any other answer (3xx, 4xx) is a refusal: retried with backoff, then a dead
letter carrying the status and the start of the answer's body.
"""

from __future__ import annotations

import http.client
import ssl
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit, urlunsplit

from pgmsg.core import conf, errors, signatures
from pgmsg.outbox.destinations.base import Envelope, Outcome, redact, seconds, short, split_options

#: Answers that say "not now" rather than "not this message".
_UNAVAILABLE_STATUSES = {408, 429}
#: How much of an answer's body a refusal quotes.
_QUOTED = 200
#: Errors of a kept-alive connection the server closed while it idled: one fresh try.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class HttpDestination:
    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        rest, options = split_options(url, {"secret": "", "timeout": "", "concurrency": "8"})
        parts = urlsplit(rest)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise errors.UnknownDestination(
                f"destination {name!r}: {redact(url)} is not an http(s)://host/path URL"
            )
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname, parts.port
        self.target = urlunsplit(("", "", parts.path or "/", parts.query, ""))
        timeout = options["timeout"] or str(conf.get().OUTBOX_PUBLISH_TIMEOUT)
        self.timeout = seconds(timeout, option="timeout", url=url)
        if not options["concurrency"].isdigit() or int(options["concurrency"]) < 1:
            raise errors.UnknownDestination(
                f"{redact(url)}: concurrency must be a positive int, got {options['concurrency']!r}"
            )
        self.concurrency = int(options["concurrency"])
        self._secret = options["secret"] or conf.get().OUTBOX_HTTP_SECRETS.get(name, "")
        if not isinstance(self._secret, str) or not self._secret:
            raise errors.UnknownDestination(
                f"destination {name!r} ({redact(url)}) needs a signing secret: "
                f"PGMSG['OUTBOX_HTTP_SECRETS'][{name!r}] (or the URL's secret= option)"
            )
        self._local = threading.local()
        self._connections: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def publish(self, envelopes: Sequence[Envelope]) -> list[Outcome]:
        if self.concurrency == 1 or len(envelopes) == 1:
            return [self._post(e) for e in envelopes]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="pgmsg-http")
        return list(self._pool.map(self._post, envelopes))

    def _post(self, envelope: Envelope) -> Outcome:
        body = envelope.body
        headers = {
            **envelope.broker_headers(),
            "pgmsg-topic": envelope.topic,
            "content-type": "application/json",
            **signatures.sign(self._secret, body),
        }
        bad = _bad_header(headers)
        if bad:
            return errors.MessageRefused(f"{self.name}: {bad}")
        reused = getattr(self._local, "connection", None) is not None
        while True:
            connection = self._connection()
            try:
                connection.request("POST", self.target, body=body, headers=headers)
                response = connection.getresponse()
                answer = response.read()
            except _STALE as exc:
                self._drop(connection)
                if reused:  # the server closed an idle connection: once more on a new one
                    reused = False
                    continue
                return self._unavailable(exc)
            except (OSError, http.client.HTTPException) as exc:  # timeouts are OSErrors
                self._drop(connection)
                return self._unavailable(exc)
            if response.will_close:
                self._drop(connection)
            return self._outcome(response.status, response.reason, answer)

    def _outcome(self, status: int, reason: str, answer: bytes) -> Outcome:
        if 200 <= status < 300:
            return None
        said = answer[:_QUOTED].decode("utf-8", "replace").strip()
        text = f"{self.name}: HTTP {status} {reason}" + (f": {said}" if said else "")
        if status >= 500 or status in _UNAVAILABLE_STATUSES:
            return errors.BrokerUnavailable(f"{text} ({redact(self.url)})")
        return errors.MessageRefused(text)

    def _unavailable(self, exc: BaseException) -> errors.BrokerUnavailable:
        return errors.BrokerUnavailable(f"{self.name} ({redact(self.url)}): {short(exc)}")

    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None or connection not in self._connections:  # none, or closed
            if self.https:
                connection = http.client.HTTPSConnection(
                    self.host, self.port, timeout=self.timeout, context=ssl.create_default_context()
                )
            else:
                connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection

    def _drop(self, connection: http.client.HTTPConnection) -> None:
        connection.close()
        self._local.connection = None
        with self._lock:
            if connection in self._connections:
                self._connections.remove(connection)

    def close(self) -> None:
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)


def _bad_header(headers: dict[str, str]) -> str:
    """Why a header cannot go on the wire (HTTP headers are latin-1, one line), or ''."""
    for name, value in headers.items():
        try:
            name.encode("ascii")
            value.encode("latin-1")
        except UnicodeEncodeError:
            return f"header {name!r} holds characters HTTP headers cannot carry (latin-1 only)"
        if any(c in name + value for c in "\r\n\0") or not name or ":" in name:
            return f"header {name!r} holds a line break, a NUL or a colon in its name"
    return ""


def from_setting(name: str, url: str) -> HttpDestination:
    return HttpDestination(name, url)
