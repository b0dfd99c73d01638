"""What every pgmsg admin shares: rows are written by pgmsg, never edited by hand."""

from __future__ import annotations

from django.contrib import admin


class MessageAdmin(admin.ModelAdmin):
    """Read-only listing; operations are admin actions guarded by their own permissions.

    An action declared with ``permissions=["replay"]`` is shown only to users who hold
    ``pgmsg.replay_<model>`` (the model's Meta.permissions declares it).
    """

    ordering = ["-id"]

    def __init__(self, model, admin_site):
        super().__init__(model, admin_site)
        self.readonly_fields = [f.name for f in model._meta.fields]

    @admin.display(description="last error")
    def short_error(self, obj):
        lines = obj.last_error.strip().splitlines()
        return lines[-1][:120] if lines else ""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def _has_operation(self, request, operation: str) -> bool:
        return request.user.has_perm(f"pgmsg.{operation}_{self.model._meta.model_name}")

    def has_replay_permission(self, request):
        return self._has_operation(request, "replay")

    def has_discard_permission(self, request):
        return self._has_operation(request, "discard")

    def has_operate_permission(self, request):
        return self._has_operation(request, "operate")
