"""Django admin for pgmsg's tables: one module per kind of message."""

from pgmsg.admin import deadletters, events, inbox, notifications, outbox, overview  # noqa: F401
