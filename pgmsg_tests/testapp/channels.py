"""Channels used by the tests."""

import datetime as dt
import enum
import uuid
from decimal import Decimal

import pgmsg


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Work(pgmsg.Channel, name="test.work"):
    """Behaviour is driven by the payload so tests can ask for failures, delays and crashes."""

    key: str
    fail_times: int = 0  # raise while the delivery's attempts are below this
    always_fail: bool = False
    sleep: float = 0.0
    # A path: the listener holds the message (its transaction kept busy) until the file exists,
    # so that a test can signal a worker while it is certainly mid-message, however slow the
    # machine.
    hold_until: str = ""


class Typed(pgmsg.Channel, name="test.typed", max_attempts=2):
    when: dt.datetime
    day: dt.date
    amount: Decimal
    ident: uuid.UUID
    colour: Colour
    tags: list[str]
    extra: dict[str, int]
    note: str | None = None


class Poison(pgmsg.Channel, name="test.poison", max_attempts=2):
    """Its listener kills its own worker process (like a segfault or the OOM killer)."""

    key: str


class Edges(pgmsg.Channel, name="test.edges"):
    """Payload values at the edge of what JSON and jsonb carry (no listener: tests read rows)."""

    at: dt.time
    ratio: float
    text: str = ""


class Shout(pgmsg.Channel, name="test.shout", delivery=pgmsg.BROADCAST):
    text: str


class Unheard(pgmsg.Channel, name="test.unheard"):
    """Has no listener: workers must leave its rows alone."""

    key: str
