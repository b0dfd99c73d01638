"""HMAC-SHA256 signatures of HTTP messages: what the outbox's HTTP destination signs and the
inbox's webhook receiver checks (both import it from here, so neither imports the other).

Three schemes, each a way to carry the signature in headers:

- ``pgmsg`` (the default): ``pgmsg-timestamp: <unix seconds>`` and
  ``pgmsg-signature: v1=<hex>``, where hex is HMAC-SHA256(secret, f"{timestamp}.{body}");
- ``stripe``: one header ``Stripe-Signature: t=<unix seconds>,v1=<hex>``, same signed text;
- ``github``: ``X-Hub-Signature-256: sha256=<hex>`` over the body alone (no timestamp, so no
  tolerance: a replay is caught by the inbox's message id only).

A signature header may carry several ``v1=`` values (a sender rotating its secret); a receiver
may hold several secrets (its own rotation): any pair that matches is enough.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import time
from collections.abc import Callable, Mapping, Sequence

from pgmsg.core import errors

PGMSG, STRIPE, GITHUB = "pgmsg", "stripe", "github"
#: Each scheme's signature header and timestamp header (None: in the signature header, or none).
DEFAULT_HEADERS = {
    PGMSG: ("pgmsg-signature", "pgmsg-timestamp"),
    STRIPE: ("Stripe-Signature", None),
    GITHUB: ("X-Hub-Signature-256", None),
}


def digest(secret: str | bytes, text: bytes) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, text, hashlib.sha256).hexdigest()


def signed_text(timestamp: int | str, body: bytes) -> bytes:
    return str(timestamp).encode() + b"." + body


def sign(secret: str | bytes, body: bytes, *, timestamp: int | None = None) -> dict[str, str]:
    """pgmsg's two headers for ``body``, signed now (or at ``timestamp``)."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        "pgmsg-timestamp": str(timestamp),
        "pgmsg-signature": "v1=" + digest(secret, signed_text(timestamp, body)),
    }


@dataclasses.dataclass(frozen=True)
class Scheme:
    """How a receiver reads a signature: the scheme's format, its header names, and how far a
    timestamp may be from the receiver's clock (seconds)."""

    format: str = PGMSG
    signature_header: str = ""
    timestamp_header: str | None = ""
    tolerance: float = 300.0

    def __post_init__(self) -> None:
        if self.format not in DEFAULT_HEADERS:
            raise errors.ConfigurationError(
                f"signature format must be one of {sorted(DEFAULT_HEADERS)}, got {self.format!r}"
            )
        signature, timestamp = DEFAULT_HEADERS[self.format]
        if not self.signature_header:
            object.__setattr__(self, "signature_header", signature)
        if self.timestamp_header == "":
            object.__setattr__(self, "timestamp_header", timestamp)
        if not isinstance(self.tolerance, int | float) or self.tolerance <= 0:
            raise errors.ConfigurationError(
                f"signature tolerance must be a positive number of seconds, got {self.tolerance!r}"
            )


def verify(
    scheme: Scheme,
    header: Callable[[str], str | None],
    body: bytes,
    secrets: Sequence[str | bytes],
    *,
    now: float | None = None,
) -> None:
    """Raise InvalidSignature unless ``body`` carries a valid signature under ``scheme``.

    ``header(name)`` returns a request header's value (case-insensitive) or None.
    """
    value = header(scheme.signature_header)
    if not value:
        raise errors.InvalidSignature(f"no {scheme.signature_header} header")
    if scheme.format == GITHUB:
        prefix, _, mac = value.strip().partition("=")
        if prefix != "sha256" or not mac:
            raise errors.InvalidSignature(f"{scheme.signature_header} is not sha256=<hex>")
        _match([mac], body, secrets)
        return
    fields = _fields(value)
    timestamp = fields.get("t", [""])[0]
    if scheme.timestamp_header:
        timestamp = header(scheme.timestamp_header) or ""
    timestamp = timestamp.strip()
    if not (timestamp.isascii() and timestamp.isdigit()):  # "²".isdigit() is True
        raise errors.InvalidSignature("no timestamp (unix seconds) with the signature")
    age = (time.time() if now is None else now) - int(timestamp)
    if abs(age) > scheme.tolerance:
        raise errors.InvalidSignature(
            f"timestamp {timestamp} is {age:.0f}s from this server's clock "
            f"(tolerance {scheme.tolerance:g}s)"
        )
    given = fields.get("v1", [])
    if not given:
        raise errors.InvalidSignature(f"{scheme.signature_header} holds no v1= signature")
    _match(given, signed_text(timestamp, body), secrets)


def _fields(value: str) -> Mapping[str, list[str]]:
    found: dict[str, list[str]] = {}
    for part in value.split(","):
        name, _, item = part.strip().partition("=")
        if item:
            found.setdefault(name, []).append(item)
    return found


def _match(given: Sequence[str], text: bytes, secrets: Sequence[str | bytes]) -> None:
    matched = False
    for secret in secrets:
        expected = digest(secret, text).encode()
        for candidate in given:
            # Every pair is compared (no early exit), each in constant time; bytes, since a
            # header may hold characters compare_digest refuses in a str.
            found = candidate.strip().lower().encode("utf-8", "replace")
            matched |= hmac.compare_digest(expected, found)
    if not matched:
        raise errors.InvalidSignature("the signature does not match")
