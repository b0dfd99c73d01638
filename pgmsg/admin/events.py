"""Admin of the event store: events (read-only) and subscription partitions with their errors."""

from __future__ import annotations

from collections import defaultdict

from django.contrib import admin, messages

from pgmsg.admin.base import MessageAdmin, ReadOnlyAdmin
from pgmsg.core import errors
from pgmsg.events import reads
from pgmsg.events import subscription_operations as subscriptions
from pgmsg.models import StoredEvent, SubscriptionPartition


@admin.register(StoredEvent)
class StoredEventAdmin(ReadOnlyAdmin):
    list_display = ["position", "stream_name", "version", "type", "recorded_at"]
    # Exact or prefix lookups only: the store is large, and list filters would scan it for
    # their DISTINCT values on every page.
    search_fields = ["=stream_name", "=message_id", "=type", "^category"]
    show_full_result_count = False
    ordering = ["-position"]
    readonly_fields = [f.name for f in StoredEvent._meta.fields]


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [(s, s) for s in ("active", "retrying", "stopped")]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "active":
            return queryset.filter(status="active", attempts=0)
        if value == "retrying":
            return queryset.filter(status="active", attempts__gt=0)
        if value == "stopped":
            return queryset.filter(status="stopped")
        return queryset


@admin.register(SubscriptionPartition)
class SubscriptionPartitionAdmin(MessageAdmin):
    list_display = [
        "subscription",
        "partition",
        "state",
        "behind",
        "last_handled",
        "handled",
        "attempts",
        "failed_position",
        "short_error",
        "updated_at",
    ]
    list_filter = [StateFilter, "subscription"]
    ordering = ["subscription", "partition"]
    actions = ["retry_selected", "skip_selected"]

    def changelist_view(self, request, extra_context=None):
        # What stops every partition from moving, named where people look when they stall.
        if request.method == "GET":
            for blocker in reads.horizon_blockers():
                self.message_user(request, f"Read horizon held back by {blocker}", messages.WARNING)
        return super().changelist_view(request, extra_context)

    def _lag(self, obj):
        # Computed once per row and page (two indexed queries; see subscription_operations.lag).
        if not hasattr(obj, "_pgmsg_lag"):
            obj._pgmsg_lag = subscriptions.lag(obj)
        return obj._pgmsg_lag

    @admin.display(description="behind the head")
    def behind(self, obj):
        lag = self._lag(obj)
        return "? (not declared)" if lag is None else lag.behind_text

    @admin.display(description="last handled position")
    def last_handled(self, obj):
        lag = self._lag(obj)
        if lag is None or lag.last_handled_position is None:
            return "-"
        return lag.last_handled_position

    @admin.action(
        description="Retry the failed event of selected partitions now", permissions=["operate"]
    )
    def retry_selected(self, request, queryset):
        try:
            count = sum(subscriptions.retry(name, parts) for name, parts in _grouped(queryset))
        except errors.PgmsgError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return
        self.message_user(request, f"Retrying {count} partition(s).", messages.SUCCESS)

    @admin.action(
        description="Skip the failed event of selected partitions", permissions=["operate"]
    )
    def skip_selected(self, request, queryset):
        try:
            count = sum(subscriptions.skip(name, parts) for name, parts in _grouped(queryset))
        except errors.PgmsgError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return
        self.message_user(
            request, f"Skipped the failed event of {count} partition(s).", messages.SUCCESS
        )


def _grouped(queryset):
    grouped = defaultdict(list)
    for name, partition in queryset.values_list("subscription", "partition"):
        grouped[name].append(partition)
    return sorted(grouped.items())
