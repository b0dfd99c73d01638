"""Django admin for pgmsg's tables: one module per kind of message."""

from pgmsg.admin import notifications  # noqa: F401
