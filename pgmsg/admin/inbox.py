"""Admin of inbox messages: listed by state, replay and discard behind their own permissions."""

from __future__ import annotations

from collections import defaultdict

from django.contrib import admin, messages
from django.db.models import Q

from pgmsg.admin.base import MessageAdmin
from pgmsg.inbox import operations as inbox_ops
from pgmsg.models import InboxMessage


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [(s, s) for s in ("pending", "retrying", "processed", "dead", "discarded")]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "pending":
            return queryset.filter(status="pending", attempts=0)
        if value == "retrying":
            return queryset.filter(Q(status="pending") & Q(attempts__gt=0))
        if value in ("processed", "dead", "discarded"):
            return queryset.filter(status=value)
        return queryset


@admin.register(InboxMessage)
class InboxMessageAdmin(MessageAdmin):
    list_display = [
        "id",
        "inbox",
        "message_id",
        "type",
        "aggregate_id",
        "state",
        "attempts",
        "received_at",
        "processed_at",
        "short_error",
    ]
    list_filter = [StateFilter, "inbox", "type"]
    search_fields = ["message_id", "aggregate_id", "trace_id", "type"]
    ordering = ["-id"]
    actions = ["replay_selected", "discard_selected"]

    @admin.action(
        description="Replay selected dead or retrying messages now", permissions=["replay"]
    )
    def replay_selected(self, request, queryset):
        count = sum(inbox_ops.replay(inbox, ids) for inbox, ids in _by_inbox(queryset).items())
        self.message_user(request, f"Replayed {count} message(s).", messages.SUCCESS)

    @admin.action(description="Discard selected dead or pending messages", permissions=["discard"])
    def discard_selected(self, request, queryset):
        reason = f"discarded in the admin by {request.user.get_username()}"
        count = sum(
            inbox_ops.discard(inbox, ids, reason=reason)
            for inbox, ids in _by_inbox(queryset).items()
        )
        self.message_user(request, f"Discarded {count} message(s).", messages.SUCCESS)


def _by_inbox(queryset) -> dict[str, list[int]]:
    grouped = defaultdict(list)
    for inbox, id_ in queryset.values_list("inbox", "id"):
        grouped[inbox].append(id_)
    return grouped
