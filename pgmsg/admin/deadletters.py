"""The admin's "Dead letters" entry of inboxes: dead inbox messages, on their own.

The same rows as the Inbox messages list filtered to "dead", with the same actions and
permissions (those of the concrete model), so a newcomer finds them by name. Dead
notifications have a table of their own: their entry is in pgmsg/admin/notifications.py.
"""

from __future__ import annotations

from django.contrib import admin

from pgmsg.admin.inbox import InboxMessageAdmin
from pgmsg.models import InboxDeadLetter


@admin.register(InboxDeadLetter)
class InboxDeadLetterAdmin(InboxMessageAdmin):
    list_display = [
        "id",
        "inbox",
        "message_id",
        "type",
        "aggregate_id",
        "attempts",
        "last_failed_at",
        "short_error",
    ]
    list_filter = ["inbox", "type"]

    def get_queryset(self, request):
        return super().get_queryset(request).filter(status=InboxDeadLetter.Status.DEAD)
