"""The admin's "Dead letters" entries: dead notifications and dead inbox messages, on their own.

The same rows as the Notifications and Inbox messages lists filtered to "dead", with the same
actions and permissions (those of the concrete models), so a newcomer finds them by name.
"""

from __future__ import annotations

from django.contrib import admin

from pgmsg.admin.inbox import InboxMessageAdmin
from pgmsg.admin.notifications import NotificationAdmin
from pgmsg.models import InboxDeadLetter, NotificationDeadLetter


@admin.register(NotificationDeadLetter)
class NotificationDeadLetterAdmin(NotificationAdmin):
    list_display = ["id", "channel", "attempts", "created_at", "last_failed_at", "short_error"]
    list_filter = ["channel"]

    def get_queryset(self, request):
        return super().get_queryset(request).filter(status=NotificationDeadLetter.Status.DEAD)


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
