"""The admin's "pgmsg overview": every channel, inbox, outbox and subscription at a glance, and
the dead letters of each with their payload, full error, and replay / discard behind
permissions.

The page hangs off a proxy model (``Overview``) so that the admin index lists it and its view
permission opens it: that permission shows counts only. A dead letter's payload and error need
the view permission of its message model (as that model's own admin list does); replay and
discard need the model's ``replay_*`` and ``discard_*`` permissions, checked again when the
form is posted. A refusal is an admin message, never a bare 403 page.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import urlencode

from pgmsg.channels import deadletters
from pgmsg.core import conf
from pgmsg.events import reads
from pgmsg.inbox import operations as inbox_ops
from pgmsg.inbox.bridges import health as bridge_health
from pgmsg.metrics import overview
from pgmsg.models import (
    InboxMessage,
    Notification,
    NotificationDeadLetter,
    OutboxMessage,
    Overview,
)
from pgmsg.outbox import operations as outbox_ops

logger = logging.getLogger(__name__)

#: Dead letters shown per page of a source's list.
LIST_LIMIT = 200
CHART_WIDTH, CHART_HEIGHT = 180, 28


class _Kind:
    """How the overview reaches the dead letters of one kind of source: ``dead_model``'s rows
    (filtered on ``dead`` where that model keeps the living too), under the permissions of
    ``model``."""

    def __init__(
        self, model: Any, dead_model: Any, dead: dict[str, str], name_field: str, label: str
    ) -> None:
        self.model, self.dead_model, self.dead_filter = model, dead_model, dead
        self.name_field, self.label = name_field, label

    def dead(self, name: str):
        rows = self.dead_model.objects.using(conf.get().DATABASE)
        return rows.filter(**self.dead_filter, **{self.name_field: name}).order_by("-id")

    def permission(self, operation: str) -> str:
        return f"pgmsg.{operation}_{self.model._meta.model_name}"

    def may(self, request: HttpRequest, operation: str) -> bool:
        return request.user.has_perm(self.permission(operation))

    def may_read(self, request: HttpRequest) -> bool:
        """Payloads and errors: the model's view permission (or change, as Django's rule)."""
        return self.may(request, "view") or self.may(request, "change")


KINDS = {
    "channel": _Kind(Notification, NotificationDeadLetter, {}, "channel", "notification"),
    "inbox": _Kind(InboxMessage, InboxMessage, {"status": "dead"}, "inbox", "inbox message"),
    "outbox": _Kind(OutboxMessage, OutboxMessage, {"status": "dead"}, "outbox", "outbox message"),
}


@admin.register(Overview)
class OverviewAdmin(admin.ModelAdmin):
    actions = None  # a page, not a list: nothing to act on, and no delete_selected

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list:
        view = self.admin_site.admin_view
        return [
            path("", view(self.overview_view), name="pgmsg_overview_changelist"),
            path("dead/<str:kind>/<str:name>/", view(self.dead_view), name="pgmsg_overview_dead"),
            path(
                "dead/<str:kind>/<str:name>/<int:pk>/",
                view(self.detail_view),
                name="pgmsg_overview_deadletter",
            ),
        ]

    # -- pages -------------------------------------------------------------------------------

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        self._require_view(request)
        rows = overview.overview()
        for row in rows:
            row.chart = _chart(row.per_minute)  # type: ignore[attr-defined]
            row.dead_url = _dead_url(row)  # type: ignore[attr-defined]
            row.age_text = _age(row.oldest_pending_age)  # type: ignore[attr-defined]
        context = {
            **self.admin_site.each_context(request),
            "title": "pgmsg overview",
            "rows": rows,
            "opts": self.opts,
            # Open transactions that hold back subscriptions, ordered inboxes and exports.
            # A blocking session's query text may quote any table's data: superusers only.
            "blockers": [
                _blocker_row(b, with_query=request.user.is_superuser)
                for b in reads.horizon_blockers()
            ],
            # Bridges from brokers into inboxes: connected, last message, lag, error.
            "bridges": bridge_health.health(),
            "totals": {
                "backlog": sum(r.backlog for r in rows),
                "dead": sum(r.dead for r in rows),
                "handled": sum(r.handled_last_hour for r in rows),
            },
        }
        return TemplateResponse(request, "admin/pgmsg/overview.html", context)

    def dead_view(self, request: HttpRequest, kind: str, name: str) -> HttpResponse:
        self._require_view(request)
        source = self._kind(kind)
        may_read = source.may_read(request)
        # Without the model's view permission, the count only: no ids, types or errors.
        rows = list(source.dead(name)[:LIST_LIMIT]) if may_read else []
        for row in rows:
            lines = row.last_error.strip().splitlines()
            row.error_line = lines[-1] if lines else ""
        context = {
            **self.admin_site.each_context(request),
            "title": f"Dead letters of {kind} {name}",
            "opts": self.opts,
            "kind": kind,
            "name": name,
            "rows": rows,
            "total": source.dead(name).count(),
            "limit": LIST_LIMIT,
            "may_read": may_read,
            "read_permission": source.permission("view"),
        }
        return TemplateResponse(request, "admin/pgmsg/deadletters.html", context)

    def detail_view(self, request: HttpRequest, kind: str, name: str, pk: int) -> HttpResponse:
        self._require_view(request)
        source = self._kind(kind)
        list_url = reverse("admin:pgmsg_overview_dead", args=[kind, name])
        if not source.may_read(request):
            return self._refuse(
                request,
                f"Reading a dead {source.label}'s payload and error needs the permission "
                f"{source.permission('view')}.",
                list_url,
            )
        row = source.dead(name).filter(pk=pk).first()
        if row is None:
            raise Http404(f"no dead {source.label} #{pk} on {kind} {name!r}")
        may_replay, may_discard = source.may(request, "replay"), source.may(request, "discard")
        if request.method == "POST":
            return self._operate(request, kind, name, row, may_replay, may_discard)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Dead {source.label} #{row.pk}",
            "opts": self.opts,
            "kind": kind,
            "name": name,
            "row": row,
            "payload": json.dumps(row.payload, indent=2, sort_keys=True, ensure_ascii=False),
            "may_replay": may_replay,
            "may_discard": may_discard,
            "list_url": list_url,
        }
        return TemplateResponse(request, "admin/pgmsg/deadletter.html", context)

    # -- operations --------------------------------------------------------------------------

    def _operate(self, request, kind, name, row, may_replay, may_discard) -> HttpResponse:
        action = request.POST.get("action")
        user = request.user.get_username()
        source = KINDS[kind]
        if action == "replay":
            if not may_replay:
                return self._refuse(
                    request,
                    f"Replaying needs the permission {source.permission('replay')}: "
                    f"#{row.pk} was not replayed.",
                    request.path,
                )
            if kind == "channel":
                deadletters.replay([row.pk])
            elif kind == "outbox":
                outbox_ops.replay([row.pk])
            else:
                inbox_ops.replay(name, [row.pk])
            self.message_user(request, f"Replayed #{row.pk}: it is due now.", messages.SUCCESS)
        elif action == "discard":
            if not may_discard:
                return self._refuse(
                    request,
                    f"Discarding needs the permission {source.permission('discard')}: "
                    f"#{row.pk} was not discarded.",
                    request.path,
                )
            reason = request.POST.get("reason", "").strip()
            if not reason:
                self.message_user(request, "Give a reason to discard.", messages.ERROR)
                return HttpResponseRedirect(request.path)
            reason = f"{reason} (discarded in the admin by {user})"
            if kind == "channel":
                # A discarded notification is deleted: the log keeps the reason.
                deadletters.discard([row.pk])
                logger.warning(
                    "pgmsg discard: kind=notification id=%s source=%s by=%s reason=%r",
                    row.pk,
                    name,
                    user,
                    reason,
                )
            elif kind == "outbox":
                outbox_ops.discard([row.pk], reason=reason)
            else:
                inbox_ops.discard(name, [row.pk], reason=reason)
            self.message_user(request, f"Discarded #{row.pk}.", messages.SUCCESS)
        else:
            return self._refuse(request, f"Unknown action {action!r}.", request.path)
        return HttpResponseRedirect(reverse("admin:pgmsg_overview_dead", args=[kind, name]))

    def _refuse(self, request: HttpRequest, text: str, url: str) -> HttpResponse:
        # As the admin refuses an action it does not offer: a message on the next page.
        self.message_user(request, text, messages.ERROR)
        return HttpResponseRedirect(url)

    def _require_view(self, request: HttpRequest) -> None:
        if not self.has_view_permission(request):
            raise PermissionDenied("the pgmsg overview needs pgmsg.view_overview")

    def _kind(self, kind: str) -> _Kind:
        try:
            return KINDS[kind]
        except KeyError:
            raise Http404(f"no dead-letter list for {kind!r}")


def _dead_url(row: overview.SourceStatus) -> str:
    if row.kind in KINDS:
        return reverse("admin:pgmsg_overview_dead", args=[row.kind, row.name])
    # A subscription's "dead letters" are its stopped partitions.
    query = urlencode({"subscription": row.name, "status__exact": "stopped"})
    return reverse("admin:pgmsg_subscriptionpartition_changelist") + "?" + query


def _blocker_row(blocker, *, with_query: bool) -> dict[str, Any]:
    return {
        "pid": blocker.pid if blocker.pid is not None else "prepared",
        "database": blocker.database,
        "state": blocker.state,
        "age": _age(blocker.age),
        "query": blocker.query if with_query else "(query text: superusers only)",
    }


def _age(seconds: float) -> str:
    if seconds <= 0:
        return "–"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _chart(per_minute: list[int]) -> dict[str, Any]:
    """An inline SVG polyline of handled messages per minute (oldest left)."""
    peak = max(per_minute) or 1
    step = CHART_WIDTH / max(len(per_minute) - 1, 1)
    points = " ".join(
        f"{i * step:.1f},{CHART_HEIGHT - 2 - (value / peak) * (CHART_HEIGHT - 4):.1f}"
        for i, value in enumerate(per_minute)
    )
    return {
        "points": points,
        "width": CHART_WIDTH,
        "height": CHART_HEIGHT,
        "peak": max(per_minute),
        "empty": not any(per_minute),
    }
