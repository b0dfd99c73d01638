"""Stream, category and event-type names: their checks, and the category of a stream."""

from __future__ import annotations

import re
from typing import Any

from pgmsg.core import errors, names

# Categories become NOTIFY payloads ("events:<category>") and filter values; the same
# character set and length as channel names keeps them readable and inside NOTIFY's limits.
MAX_CATEGORY_LENGTH = 57
MAX_STREAM_NAME_LENGTH = 200
_CATEGORY_RE = re.compile(r"^[a-z][a-z0-9_.]*$")
_STREAM_ID_RE = re.compile(r"^[A-Za-z0-9_.:@+=~-]+$")
_TYPE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.]*$")


def category_of(stream: str) -> str:
    """``account`` for ``account-123``."""
    return stream.split("-", 1)[0]


def validate_stream_name(stream: Any) -> str:
    """Return ``stream`` if it is ``<category>-<id>``; raise InvalidStreamName quoting it if not."""
    if not isinstance(stream, str) or "-" not in stream:
        raise errors.InvalidStreamName(
            f"invalid stream name {stream!r}: use '<category>-<id>', e.g. 'account-123'"
        )
    category, ident = stream.split("-", 1)
    # Every append passes here: the messages (reprs) are made only for a name that fails.
    if not _CATEGORY_RE.match(category) or len(category.encode()) > MAX_CATEGORY_LENGTH:
        validate_category(category, stream=stream)  # raises, saying which
    if not _STREAM_ID_RE.match(ident):
        raise errors.InvalidStreamName(
            f"invalid stream name {stream!r}: the id after the first '-' must be non-empty "
            "letters, digits or _.:@+=~-"
        )
    if len(stream.encode()) > MAX_STREAM_NAME_LENGTH:
        names.check_length(
            stream, MAX_STREAM_NAME_LENGTH, errors.InvalidStreamName, f"stream name {stream!r}"
        )
    return stream


def validate_category(category: Any, *, stream: str | None = None) -> str:
    what = f"stream name {stream!r}" if stream is not None else f"category {category!r}"
    if not isinstance(category, str) or not _CATEGORY_RE.match(category):
        raise errors.InvalidStreamName(
            f"invalid {what}: the category must be lowercase letters, digits, '_' or '.', "
            "starting with a letter"
        )
    where = what if stream is None else f"category in {what}"
    names.check_length(category, MAX_CATEGORY_LENGTH, errors.InvalidStreamName, where)
    return category


def is_type_name(value: object) -> bool:
    """Whether ``value`` may name an event type."""
    return isinstance(value, str) and bool(_TYPE_RE.match(value))
