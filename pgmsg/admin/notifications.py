"""Admin of stored notifications and their dead letters: replay and discard behind permissions."""

from __future__ import annotations

from django.contrib import admin, messages

from pgmsg.admin.base import MessageAdmin
from pgmsg.channels import deadletters as deadletter
from pgmsg.models import Notification, NotificationDeadLetter


class PendingStateFilter(admin.SimpleListFilter):
    """Stored notifications by state: pending (never tried) or retrying (dead letters have
    their own list)."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("pending", "pending"), ("retrying", "retrying")]

    def queryset(self, request, queryset):
        if self.value() == "pending":
            return queryset.filter(attempts=0)
        if self.value() == "retrying":
            return queryset.filter(attempts__gt=0)
        return queryset


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
    list_filter = [PendingStateFilter, "channel"]
    search_fields = ["channel", "last_error"]
    ordering = ["-id"]
    actions = ["replay_selected"]

    @admin.action(description="Replay selected notifications now", permissions=["replay"])
    def replay_selected(self, request, queryset):
        count = deadletter.replay(queryset.values_list("id", flat=True))
        self.message_user(request, f"Replayed {count} notification(s).", messages.SUCCESS)


@admin.register(NotificationDeadLetter)
class NotificationDeadLetterAdmin(NotificationAdmin):
    """The dead notifications (a table of their own), under Notification's permissions."""

    permission_model = Notification
    list_display = ["id", "channel", "attempts", "created_at", "last_failed_at", "short_error"]
    list_filter = ["channel"]
    actions = ["replay_selected", "discard_selected"]

    @admin.action(description="Discard selected dead letters", permissions=["discard"])
    def discard_selected(self, request, queryset):
        reason = f"discarded in the admin by {request.user.get_username()}"
        count = deadletter.discard(queryset.values_list("id", flat=True), reason=reason)
        self.message_user(request, f"Discarded {count} notification(s).", messages.SUCCESS)
