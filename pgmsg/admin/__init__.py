"""Django admin for pgmsg's tables: one module per kind of message."""

from pgmsg.admin import inbox, notifications  # noqa: F401
