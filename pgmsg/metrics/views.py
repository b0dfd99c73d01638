"""The metrics of the web process's view: ``path("pgmsg/", include("pgmsg.urls"))`` serves
them at pgmsg/metrics/. Run the web server with the workers' PROMETHEUS_MULTIPROC_DIR to
include their counters; expose it to your Prometheus only (it shows queue sizes)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from pgmsg.core import metrics as instruments
from pgmsg.metrics import exporter


def metrics(request: HttpRequest) -> HttpResponse:
    if not instruments.enabled():
        return HttpResponse(
            f"prometheus_client is not installed: {exporter.INSTALL}\n",
            status=501,
            content_type="text/plain",
        )
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return HttpResponse(generate_latest(exporter.registry()), content_type=CONTENT_TYPE_LATEST)
