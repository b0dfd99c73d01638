"""Django admin for pgmsg's tables: one module per kind of message."""

from pgmsg.admin import events, inbox, notifications  # noqa: F401
