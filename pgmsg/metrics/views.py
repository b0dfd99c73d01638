"""The metrics of the web process's view: ``path("pgmsg/", include("pgmsg.urls"))`` serves
them at pgmsg/metrics/ to a user with pgmsg.view_overview or a client that sends the PGMSG
ENDPOINT_TOKEN as a bearer token (pgmsg.core.access). Run the web server with the workers'
PROMETHEUS_MULTIPROC_DIR to include their counters."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from pgmsg.core import access, instruments
from pgmsg.metrics import exporter


def metrics(request: HttpRequest) -> HttpResponse:
    if not access.may_read(request):
        # Every source's name and backlog: not for anonymous clients.
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            return HttpResponse(
                "needs pgmsg.view_overview\n", status=403, content_type="text/plain"
            )
        response = HttpResponse(
            "needs a login with pgmsg.view_overview or the ENDPOINT_TOKEN bearer token\n",
            status=401,
            content_type="text/plain",
        )
        response["WWW-Authenticate"] = 'Bearer realm="pgmsg"'
        return response
    if not instruments.enabled():
        return HttpResponse(
            f"prometheus_client is not installed: {exporter.INSTALL}\n",
            status=501,
            content_type="text/plain",
        )
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return HttpResponse(generate_latest(exporter.registry()), content_type=CONTENT_TYPE_LATEST)
