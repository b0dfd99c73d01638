"""Admin of stored notifications: listed by state, replay and discard behind permissions."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Q

from pgmsg import deadletter
from pgmsg.models import Notification


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("pending", "pending"), ("retrying", "retrying"), ("dead", "dead")]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "pending":
            return queryset.filter(status="pending", attempts=0)
        if value == "retrying":
            return queryset.filter(Q(status="pending") & Q(attempts__gt=0))
        if value == "dead":
            return queryset.filter(status="dead")
        return queryset


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
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
    readonly_fields = [f.name for f in Notification._meta.fields]
    actions = ["replay_selected", "discard_selected"]

    @admin.display(description="last error")
    def short_error(self, obj):
        lines = obj.last_error.strip().splitlines()
        return lines[-1][:120] if lines else ""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_replay_permission(self, request):
        return request.user.has_perm("pgmsg.replay_notification")

    def has_discard_permission(self, request):
        return request.user.has_perm("pgmsg.discard_notification")

    @admin.action(description="Replay selected notifications now", permissions=["replay"])
    def replay_selected(self, request, queryset):
        count = deadletter.replay(queryset.values_list("id", flat=True))
        self.message_user(request, f"Replayed {count} notification(s).", messages.SUCCESS)

    @admin.action(description="Discard selected dead notifications", permissions=["discard"])
    def discard_selected(self, request, queryset):
        count = deadletter.discard(queryset.values_list("id", flat=True))
        skipped = queryset.count()  # what is left of the selection was not dead
        note = f" ({skipped} not dead, left alone)" if skipped else ""
        self.message_user(request, f"Discarded {count} notification(s){note}.", messages.SUCCESS)
