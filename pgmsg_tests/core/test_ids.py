"""New message ids: version-7 UUIDs that sort by creation time."""

from __future__ import annotations

import os
import time
import uuid

import pytest

import pgmsg
from pgmsg.core.ids import uuid7


def test_an_id_is_a_version_7_uuid_that_begins_with_the_time_in_milliseconds():
    before = time.time_ns() // 1_000_000
    value = uuid7()
    after = time.time_ns() // 1_000_000
    assert (value.version, value.variant) == (7, uuid.RFC_4122)
    assert before <= value.int >> 80 <= after


def test_ids_of_later_milliseconds_sort_after_and_none_repeat():
    first = [uuid7() for _ in range(1000)]
    time.sleep(0.002)
    later = [uuid7() for _ in range(1000)]
    assert max(first) < min(later)  # what keeps a unique index's inserts at its right edge
    assert len(set(first + later)) == 2000


def test_events_get_one_by_default():
    class Noted(pgmsg.Event, type="test.ids.noted"):
        n: int

    assert Noted(n=1).message_id.version == 7


@pytest.mark.django_db(transaction=True)
def test_outbox_messages_get_one_by_default():
    published = pgmsg.publish("test.recorded", {"n": 1}, type="t")
    assert uuid.UUID(published.message_id).version == 7


def test_an_id_is_the_uuid_its_text_parses_to():
    value = uuid7()
    parsed = uuid.UUID(str(value))
    assert parsed == value and hash(parsed) == hash(value) and parsed.bytes == value.bytes
    assert value.is_safe is uuid.SafeUUID.unknown
    assert str(value) == str(parsed) and repr(value) == repr(parsed)


def test_ids_made_across_many_draws_of_random_bytes_never_repeat():
    made = [uuid7() for _ in range(20_000)]  # about 80 draws of the OS's random bytes
    assert len(set(made)) == len(made)
    assert len({value.int & ((1 << 62) - 1) for value in made}) == len(made)


def test_a_forked_child_does_not_reuse_its_parents_random_bytes():
    uuid7()  # the parent holds drawn bytes now
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # the child: its next id's random bits, then out at once
        try:
            os.write(writer, (uuid7().int & RANDOM_BITS).to_bytes(16, "big"))
        finally:
            os._exit(0)
    os.close(writer)
    from_child = int.from_bytes(os.read(reader, 16), "big")
    os.close(reader)
    os.waitpid(child, 0)
    # Without the reset at fork, both would hand out the same next 10 bytes.
    assert from_child != uuid7().int & RANDOM_BITS


#: The 74 random bits of a version-7 id (rand_a and rand_b).
RANDOM_BITS = (0xFFF << 64) | ((1 << 62) - 1)
