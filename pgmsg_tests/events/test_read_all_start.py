"""read_all() starts at the beginning when ``after`` is omitted or None; checkpoints are pairs."""

import pytest

import pgmsg
from pgmsg.core import errors
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.events.test_subscriptions import HORIZON_TIMEOUT
from pgmsg_tests.testapp.events_handlers import Deposited

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def two_events():
    pgmsg.append("account-1", [Deposited(amount=1), Deposited(amount=2)])
    # Readable once every older transaction on the server has ended (a shared server's other
    # sessions can hold that back for a while).
    wait_for(lambda: len(pgmsg.read_all()) == 2, timeout=HORIZON_TIMEOUT, message="readable")


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"after": None}, {"after": pgmsg.START}, {"after": (0, 0)}, {"after": [0, 0]}],
    ids=["omitted", "None", "START", "tuple", "list"],
)
def test_the_beginning(two_events, kwargs):
    assert [r.version for r in pgmsg.read_all(**kwargs)] == [1, 2]


def test_a_stored_checkpoint_pair_continues_after_it(two_events):
    first = pgmsg.read_all(limit=1)[0]
    stored = tuple(first.checkpoint)  # e.g. two bigint columns
    assert isinstance(first.checkpoint, pgmsg.Checkpoint)
    assert [r.version for r in pgmsg.read_all(after=stored)] == [2]


@pytest.mark.parametrize("bad", [5, "0", (1,), (1, -1), (True, 0)])
def test_anything_else_is_refused_saying_what_a_checkpoint_is(bad):
    with pytest.raises(errors.InvalidCheckpoint, match="pgmsg.START"):
        pgmsg.read_all(after=bad)
