"""Signed webhooks into the inbox: PGMSG["WEBHOOKS"], and the view that receives them.

A POST is checked in this order, and each check answers on its own (JSON ``{"error": ...}``):
no Content-Length 411, a body over ``max_body`` 413 (unread), a missing or wrong signature or
a timestamp outside the tolerance 401, a body that is not JSON or lacks the message id or type
400. Nothing is stored before all of them pass. Then receive() stores the message, one
statement outside any transaction that commits when it returns, and only then is the answer
200 (``{"stored": true}``, or ``false`` for a duplicate); a database that fails answers 503,
so the sender tries again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.db import DatabaseError, DataError, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from pgmsg.core import conf, errors, signatures
from pgmsg.inbox import declarations

logger = logging.getLogger(__name__)

#: Where each field comes from by default: ``header:<name>`` or ``body:<dotted.path>``, the
#: first one present wins.
DEFAULT_FIELDS = {
    signatures.PGMSG: {
        "message_id": ["header:pgmsg-message-id"],
        "type": ["header:pgmsg-type"],
        "aggregate_id": ["header:pgmsg-key"],
        "trace_id": ["header:traceparent"],
    },
    signatures.STRIPE: {
        "message_id": ["body:id"],
        "type": ["body:type"],
        "aggregate_id": [],
        "trace_id": [],
    },
    signatures.GITHUB: {
        "message_id": ["header:X-GitHub-Delivery"],
        "type": ["header:X-GitHub-Event"],
        "aggregate_id": [],
        "trace_id": [],
    },
}
_OPTIONS = {
    "inbox",
    "secret",
    "secrets",
    "format",
    "signature_header",
    "timestamp_header",
    "tolerance",
    "max_body",
    "source",
    *DEFAULT_FIELDS[signatures.PGMSG],
}


@dataclasses.dataclass(frozen=True)
class Webhook:
    """One entry of PGMSG["WEBHOOKS"], checked."""

    name: str
    inbox: str
    secrets: tuple[str, ...] = dataclasses.field(repr=False)  # never in a log or an error
    scheme: signatures.Scheme
    max_body: int
    source: str
    fields: dict[str, list[str]]

    @classmethod
    def from_setting(cls, name: str, value: object) -> Webhook:
        where = f"PGMSG['WEBHOOKS'][{name!r}]"
        if not isinstance(value, dict):
            raise errors.ConfigurationError(f"{where} must be a dict, got {type(value).__name__}")
        unknown = sorted(set(value) - _OPTIONS)
        if unknown:
            raise errors.ConfigurationError(
                f"{where}: unknown option(s) {unknown}; known: {sorted(_OPTIONS)}"
            )
        inbox = value.get("inbox")
        if not isinstance(inbox, str) or not inbox:
            raise errors.ConfigurationError(f"{where}: 'inbox' must name a declared inbox")
        try:
            scheme = signatures.Scheme(
                format=value.get("format", signatures.PGMSG),
                signature_header=value.get("signature_header", ""),
                timestamp_header=value.get("timestamp_header", ""),
                tolerance=value.get("tolerance", 300.0),
            )
        except errors.ConfigurationError as exc:
            raise errors.ConfigurationError(f"{where}: {exc}") from None
        max_body = value.get("max_body", 1024 * 1024)
        if not isinstance(max_body, int) or isinstance(max_body, bool) or max_body < 1:
            raise errors.ConfigurationError(f"{where}: max_body must be a positive int (bytes)")
        return cls(
            name=name,
            inbox=inbox,
            secrets=_secrets(value, where),
            scheme=scheme,
            max_body=max_body,
            source=value.get("source", f"webhook:{name}"),
            fields=_fields(value, where, scheme.format),
        )


def _secrets(value: dict, where: str) -> tuple[str, ...]:
    """'secret', or 'secrets' (several: a rotation), each a non-empty str."""
    secrets = value.get("secrets", [value["secret"]] if "secret" in value else [])
    if (
        isinstance(secrets, str)
        or not secrets
        or not all(isinstance(s, str) and s for s in secrets)
    ):
        raise errors.ConfigurationError(
            f"{where}: needs 'secret' (a non-empty str) or 'secrets' (a list of them)"
        )
    return tuple(secrets)


def _fields(value: dict, where: str, format: str) -> dict[str, list[str]]:
    """Where each of the message's fields comes from: the format's defaults, overridden."""
    fields = dict(DEFAULT_FIELDS[format])
    for field in fields:
        if field in value:
            specs = value[field]
            specs = [specs] if isinstance(specs, str) else specs
            if not isinstance(specs, list) or not all(_valid_spec(s) for s in specs):
                raise errors.ConfigurationError(
                    f"{where}: {field!r} must be 'header:<name>' or 'body:<dotted.path>' "
                    f"(or a list of them), got {value[field]!r}"
                )
            fields[field] = specs
    return fields


def _valid_spec(spec: object) -> bool:
    kind, _, where = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    return kind in ("header", "body") and bool(where)


#: The settings the parsed entries came from, and the entries: parsed once per settings.
_parsed: tuple[object, dict[str, Webhook]] = (None, {})


def webhook(name: str) -> Webhook:
    global _parsed
    settings = conf.get()
    if _parsed[0] is not settings:
        _parsed = (settings, {})
    found = _parsed[1].get(name)
    if found is None:
        value = settings.WEBHOOKS.get(name)
        if value is None:
            raise LookupError(name)
        found = _parsed[1][name] = Webhook.from_setting(name, value)
    return found


class Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def _read(request: HttpRequest, hook: Webhook) -> bytes:
    length = request.META.get("CONTENT_LENGTH") or ""
    if not length.isdigit():
        raise Refused(411, "a Content-Length header is required")
    if int(length) > hook.max_body:
        raise Refused(413, f"the body is over {hook.max_body} bytes")
    return request.read(int(length))


def _find(specs: Sequence[str], header: Callable[[str], str | None], body: Any) -> Any:
    for spec in specs:
        kind, _, where = spec.partition(":")
        if kind == "header":
            value = header(where)
        else:
            value = body
            for step in where.split("."):
                value = value.get(step) if isinstance(value, dict) else None
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if isinstance(value, str) and value:
            return value
    return None


def message_of(hook: Webhook, header: Callable[[str], str | None], raw: bytes) -> dict:
    """receive()'s keywords for a verified body, or Refused(400) saying what is missing."""
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError too
        raise Refused(400, f"the body is not JSON: {type(exc).__name__}: {exc}") from None
    found = {field: _find(specs, header, payload) for field, specs in hook.fields.items()}
    for field in ("message_id", "type"):
        if found[field] is None:
            raise Refused(400, f"no {field} (looked in {', '.join(hook.fields[field]) or '-'})")
    return {
        "message_id": found["message_id"],
        "type": found["type"],
        "payload": payload,
        "source": hook.source,
        "aggregate_id": found["aggregate_id"],
        "trace_id": found["trace_id"] or "",
    }


def _handle(request: HttpRequest, name: str) -> JsonResponse:
    if request.method != "POST":
        return _answer(405, error="POST only")
    try:
        hook = webhook(name)
    except LookupError:
        return _answer(404, error="no such webhook")
    header = request.headers.get
    try:
        raw = _read(request, hook)
        try:
            signatures.verify(hook.scheme, header, raw, hook.secrets)
        except errors.InvalidSignature as exc:
            logger.warning("pgmsg webhook %r: 401: %s", name, exc)
            raise Refused(401, "invalid signature") from None
        message = message_of(hook, header, raw)
        # One statement: outside a transaction (the view opts out of ATOMIC_REQUESTS) it
        # commits when it returns, with no BEGIN and COMMIT round trips around it.
        received = declarations.receive(hook.inbox, **message)
    except Refused as exc:
        if exc.status != 401:
            logger.warning("pgmsg webhook %r: %s: %s", name, exc.status, exc)
        return _answer(exc.status, error=str(exc))
    except errors.InvalidMessage as exc:
        return _answer(400, error=str(exc))
    except DataError as exc:  # a value PostgreSQL refuses (jsonb's \u0000): sending again won't do
        logger.warning("pgmsg webhook %r: 400: PostgreSQL refuses the message: %s", name, exc)
        return _answer(400, error=f"PostgreSQL refuses the message: {str(exc).splitlines()[0]}")
    except DatabaseError as exc:
        logger.error("pgmsg webhook %r: not stored, answering 503: %s", name, exc)
        return _answer(503, error="not stored; try again")
    # Only here is the message committed: the 200 may follow.
    return _answer(200, stored=received.stored, message_id=received.message_id)


def _answer(status: int, **body: Any) -> JsonResponse:
    return JsonResponse(body, status=status)


def _outside_request_transactions(view):
    """ATOMIC_REQUESTS would wrap the view in a transaction that commits after the answer is
    made: the view opts out on every database, so its 200 follows its own commit."""
    for alias in django_settings.DATABASES:
        view = transaction.non_atomic_requests(using=alias)(view)
    return view


@csrf_exempt
def receive_webhook(request: HttpRequest, name: str) -> JsonResponse:
    """The view of pgmsg.urls' ``webhooks/<name>/``: the webhook ``name`` of PGMSG WEBHOOKS."""
    return _handle(request, name)


receive_webhook = _outside_request_transactions(receive_webhook)


def receiver(name: str) -> Callable[[HttpRequest], JsonResponse]:
    """A view for one webhook, to mount at a path of one's own:
    ``path("hooks/stripe/", webhooks.receiver("stripe"))``."""

    @csrf_exempt
    def view(request: HttpRequest) -> JsonResponse:
        return _handle(request, name)

    view.__name__ = f"receive_webhook_{name}"
    return _outside_request_transactions(view)


@checks.register()
def check_webhooks(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """Every PGMSG WEBHOOKS entry must parse and name a declared inbox."""
    found = []
    for name, value in conf.get().WEBHOOKS.items():
        try:
            hook = Webhook.from_setting(name, value)
            declarations.registry.get(hook.inbox)
        except (errors.ConfigurationError, errors.UnknownInbox) as exc:
            found.append(checks.Error(str(exc), id="pgmsg.E402"))
    return found
