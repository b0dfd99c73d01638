"""Admin of outbox messages: listed by state, replay and discard behind their own permissions."""

from __future__ import annotations

from django.contrib import admin, messages

from pgmsg.admin.base import MessageAdmin, StateFilter
from pgmsg.models import OutboxMessage
from pgmsg.outbox import operations as outbox_ops


@admin.register(OutboxMessage)
class OutboxMessageAdmin(MessageAdmin):
    list_display = [
        "id",
        "outbox",
        "destination",
        "topic",
        "type",
        "key",
        "state",
        "attempts",
        "created_at",
        "short_error",
    ]
    list_filter = [StateFilter, "outbox", "destination"]
    search_fields = ["=message_id", "=key", "type", "topic"]
    ordering = ["-id"]
    actions = ["replay_selected", "discard_selected"]

    def has_delete_permission(self, request, obj=None):
        return False  # discarding is an action with its own permission

    @admin.action(
        description="Replay selected dead or retrying messages now", permissions=["replay"]
    )
    def replay_selected(self, request, queryset):
        count = outbox_ops.replay(queryset.values_list("id", flat=True))
        self.message_user(request, f"Replayed {count} message(s).", messages.SUCCESS)

    @admin.action(description="Discard selected messages unpublished", permissions=["discard"])
    def discard_selected(self, request, queryset):
        reason = f"discarded in the admin by {request.user.get_username()}"
        count = outbox_ops.discard(queryset.values_list("id", flat=True), reason=reason)
        self.message_user(request, f"Discarded {count} message(s).", messages.SUCCESS)
