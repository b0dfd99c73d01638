"""pgmsg's URLs: ``path("pgmsg/", include("pgmsg.urls"))`` in the project's urlconf."""

from __future__ import annotations

from django.urls import path

from pgmsg.inbox import views, webhooks
from pgmsg.metrics import views as metrics_views

app_name = "pgmsg"

urlpatterns = [
    path("inbox/health/", views.inbox_health, name="inbox-health"),
    path("inbox/health/<str:name>/", views.inbox_health, name="inbox-health-one"),
    path("webhooks/<str:name>/", webhooks.receive_webhook, name="webhook"),
    path("metrics/", metrics_views.metrics, name="metrics"),
]
