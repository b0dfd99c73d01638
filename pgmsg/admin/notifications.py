"""Admin of stored notifications: listed by state, replay and discard behind permissions."""

from __future__ import annotations

from django.contrib import admin, messages

from pgmsg.admin.base import MessageAdmin, StateFilter
from pgmsg.channels import deadletters as deadletter
from pgmsg.models import Notification


@admin.register(Notification)
class NotificationAdmin(MessageAdmin):
    list_display = [
        "id",
        "channel",
        "state",
        "attempts",
        "created_at",
        "available_at",
        "short_error",
    ]
    list_filter = [StateFilter, "channel"]
    search_fields = ["channel", "last_error"]
    ordering = ["-id"]
    actions = ["replay_selected", "discard_selected"]

    @admin.action(description="Replay selected notifications now", permissions=["replay"])
    def replay_selected(self, request, queryset):
        count = deadletter.replay(queryset.values_list("id", flat=True))
        self.message_user(request, f"Replayed {count} notification(s).", messages.SUCCESS)

    @admin.action(description="Discard selected dead notifications", permissions=["discard"])
    def discard_selected(self, request, queryset):
        reason = f"discarded in the admin by {request.user.get_username()}"
        count = deadletter.discard(queryset.values_list("id", flat=True), reason=reason)
        skipped = queryset.count()  # what is left of the selection was not dead
        note = f" ({skipped} not dead, left alone)" if skipped else ""
        self.message_user(request, f"Discarded {count} notification(s){note}.", messages.SUCCESS)
