"""What every pgmsg admin shares: rows are written by pgmsg, never edited or deleted by hand."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Q
from django.utils.html import format_html


class ReadOnlyAdmin(admin.ModelAdmin):
    """No add, no change, and no delete: not even for superusers.

    Django's own delete (the change page's Delete button and the ``delete_selected`` action)
    would remove rows that pgmsg still has to handle, without the audit trail of pgmsg's own
    operations (who discarded what, when, why). Rows leave only through those operations,
    offered as actions guarded by their own permissions.
    """

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions


class MessageAdmin(ReadOnlyAdmin):
    """Read-only listing; operations are admin actions guarded by their own permissions.

    An action declared with ``permissions=["replay"]`` is shown only to users who hold
    ``pgmsg.replay_<model>`` (the model's Meta.permissions declares it; a proxy model, such as
    a dead-letter listing, uses its concrete model's permissions; ``permission_model`` names
    another model whose permissions apply).
    """

    ordering = ["-id"]
    permission_model = None

    def __init__(self, model, admin_site):
        super().__init__(model, admin_site)
        # The error is shown as preformatted text: a traceback keeps its indentation.
        self.readonly_fields = [
            "error_detail" if f.name == "last_error" else f.name for f in model._meta.fields
        ]

    @admin.display(description="last error")
    def short_error(self, obj):
        lines = obj.last_error.strip().splitlines()
        return lines[-1][:120] if lines else ""

    @admin.display(description="last error")
    def error_detail(self, obj):
        if not obj.last_error:
            return ""
        return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>', obj.last_error)

    def _permission(self, action: str) -> str:
        concrete = (self.permission_model or self.model)._meta.concrete_model._meta
        return f"{concrete.app_label}.{action}_{concrete.model_name}"

    def _has_operation(self, request, operation: str) -> bool:
        return request.user.has_perm(self._permission(operation))

    def has_view_permission(self, request, obj=None):
        # As Django's own rule (view or change), on the concrete model's permissions.
        return request.user.has_perm(self._permission("view")) or request.user.has_perm(
            self._permission("change")
        )

    def has_replay_permission(self, request):
        return self._has_operation(request, "replay")

    def has_discard_permission(self, request):
        return self._has_operation(request, "discard")

    def has_operate_permission(self, request):
        return self._has_operation(request, "operate")


class StateFilter(admin.SimpleListFilter):
    """Messages by state: pending (never tried), retrying, dead (the outbox)."""

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
