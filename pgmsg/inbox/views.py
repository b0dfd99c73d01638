"""Small JSON endpoints for monitors and load balancers."""

from __future__ import annotations

from django.http import Http404, HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from pgmsg.core import errors
from pgmsg.inbox import operations as inbox_ops


@require_GET
def inbox_health(request: HttpRequest, name: str | None = None) -> JsonResponse:
    """Health of every declared inbox (or one): HTTP 200 when all are healthy, 503 if not.

    Only counts are shown, no message content; protect the URL like any internal endpoint.
    """
    try:
        rows = inbox_ops.health(None if name is None else [name])
    except errors.UnknownInbox as exc:
        raise Http404(str(exc))
    degraded = any(h.status == inbox_ops.DEGRADED for h in rows)
    return JsonResponse(
        {
            "status": inbox_ops.DEGRADED if degraded else inbox_ops.HEALTHY,
            "inboxes": {h.inbox: h.as_dict() for h in rows},
        },
        status=503 if degraded else 200,
    )
