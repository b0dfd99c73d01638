"""Small JSON endpoints for monitors and load balancers."""

from __future__ import annotations

from django.http import Http404, HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from pgmsg.core import access, errors
from pgmsg.inbox import operations as inbox_ops
from pgmsg.inbox.bridges import health as bridge_health


@require_GET
def inbox_health(request: HttpRequest, name: str | None = None) -> JsonResponse:
    """Health of every declared inbox (or one): HTTP 200 when all are healthy, 503 if not.

    Anyone gets the status (what a load balancer needs); inbox names and counts need a user
    with pgmsg.view_overview or the PGMSG ENDPOINT_TOKEN (pgmsg.core.access). The bridges
    feeding the inboxes (all, or the one inbox's) count too, listed under "bridges".
    """
    try:
        rows = inbox_ops.health(None if name is None else [name])
    except errors.UnknownInbox as exc:
        raise Http404(str(exc))
    bridges = bridge_health.health(inbox=name)
    degraded = any(h.status == inbox_ops.DEGRADED for h in [*rows, *bridges])
    body: dict = {"status": inbox_ops.DEGRADED if degraded else inbox_ops.HEALTHY}
    if access.may_read(request):
        body["inboxes"] = {h.inbox: h.as_dict() for h in rows}
        if bridges:
            body["bridges"] = {b.bridge: b.as_dict() for b in bridges}
    return JsonResponse(body, status=503 if degraded else 200)
