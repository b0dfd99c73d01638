"""New message ids: UUIDs that begin with their creation time (RFC 9562, version 7).

The event store and the outbox keep every message id in a unique index. Random (version 4)
ids land on a random leaf page of that index each: once the index outgrows shared_buffers,
each insert reads and dirties a page of its own (and writes it whole to the WAL after every
checkpoint). Ids that begin with the time go in at the index's right edge, as a serial key
does. Python 3.14's uuid.uuid7() does the same; this one runs on 3.11.
"""

from __future__ import annotations

import os
import time
import uuid

__all__ = ["uuid7"]

_MS_MASK = (1 << 48) - 1
_RAND_B_MASK = (1 << 62) - 1


def uuid7() -> uuid.UUID:
    """A new version-7 UUID: 48 bits of Unix time in milliseconds, then 74 random bits."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")  # 80 bits: 12 for rand_a, 62 for rand_b
    return uuid.UUID(
        int=(ms & _MS_MASK) << 80
        | 0x7 << 76  # version
        | (rand >> 62 & 0xFFF) << 64  # rand_a
        | 0b10 << 62  # variant (RFC 9562)
        | rand & _RAND_B_MASK  # rand_b
    )
