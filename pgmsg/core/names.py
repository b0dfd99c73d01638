"""Names that reach SQL and NOTIFY: channels, inboxes, subscriptions, outboxes."""

from __future__ import annotations

import re
from typing import Any

from pgmsg.core import errors

# PostgreSQL truncates identifiers to 63 bytes (NAMEDATALEN - 1); a LISTEN on a longer name
# would silently listen on the truncated one. Broadcast channels are NOTIFYed as
# "pgmsg:<name>", so names stay within 63 - 6 bytes. The character set keeps names readable in
# SQL and safe to embed as literals in trigger bodies.
MAX_NAME_LENGTH = 57
_NAME_RE = re.compile(r"^[a-z][a-z0-9_.\-]*$")


def validate_name(name: Any, *, kind: str = "channel") -> str:
    """Return ``name`` if it may be used as a channel name; raise InvalidName quoting it if not."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise errors.InvalidName(
            f"invalid {kind} name {name!r}: use lowercase letters, digits, '_', '.' or '-', "
            "starting with a letter"
        )
    check_length(name, MAX_NAME_LENGTH, errors.InvalidName, f"{kind} name {name!r}")
    return name


def check_length(value: str, limit: int, error: type[Exception], what: str) -> None:
    """Raise ``error`` when ``value`` is over ``limit`` bytes (PostgreSQL counts bytes)."""
    size = len(value.encode())
    if size > limit:
        raise error(f"invalid {what}: {size} bytes, at most {limit}")
