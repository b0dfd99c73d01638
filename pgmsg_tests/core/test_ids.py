"""New message ids: version-7 UUIDs that sort by creation time."""

from __future__ import annotations

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
