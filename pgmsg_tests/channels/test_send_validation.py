"""Sending validates against the declared types: the error reaches the code that sent."""

import pytest
from django.test import override_settings

import pgmsg
from pgmsg.core import errors, payload_encoders, payloads
from pgmsg.models import Notification, StoredEvent
from pgmsg_tests.testapp.channels import Shout, Typed, Work
from pgmsg_tests.testapp.events_handlers import Deposited, Step

pytestmark = pytest.mark.django_db


def test_notify_refuses_a_value_its_field_type_cannot_hold():
    with pytest.raises(errors.PayloadError, match=r"channel 'test.work'.*Work\.key: 5 is not"):
        pgmsg.notify(Work(key=5))
    assert not Notification.objects.exists()


def test_notify_refuses_a_bad_value_nested_in_a_container():
    message = Typed(
        when="2026-01-01T00:00:00Z",
        day="2026-01-01",
        amount="1.5",
        ident="0b7c4c7e-4f4e-4d3c-9b8a-1c2d3e4f5a6b",
        colour="red",
        tags=["a"],
        extra={"n": "x"},
    )
    with pytest.raises(errors.PayloadError, match=r"Typed\.extra\['n'\]: 'x' is not a valid int"):
        pgmsg.notify(message)


def test_notify_many_refuses_the_batch_with_one_bad_message():
    with pytest.raises(errors.PayloadError, match=r"Work\.always_fail"):
        pgmsg.notify_many([Work(key="a"), Work(key="b", always_fail="yes")])
    assert not Notification.objects.exists()


def test_broadcast_is_validated_too():
    with pytest.raises(errors.PayloadError, match=r"channel 'test.shout'"):
        pgmsg.notify(Shout(text=["not", "text"]))


def test_append_refuses_an_event_its_types_cannot_hold():
    with pytest.raises(errors.PayloadError, match=r"'test.step'.*Step\.n: 'x' is not a valid int"):
        pgmsg.append("count-1", [Step(n="x")])
    assert not StoredEvent.objects.exists()


def test_values_that_decode_are_accepted():
    pgmsg.notify(Work(key="ok"))
    pgmsg.append("account-1", [Deposited(amount="10.5")])
    assert Notification.objects.count() == 1 and StoredEvent.objects.count() == 1


@override_settings(PGMSG={"VALIDATE_ON_SEND": False})
def test_the_check_can_be_turned_off():
    pgmsg.notify(Work(key=5))
    assert Notification.objects.get().payload == {
        "key": 5,
        "fail_times": 0,
        "always_fail": False,
        "sleep": 0.0,
        "hold_until": "",
    }


# -- the plain path: fields of exactly their JSON type skip the decode ---------------------


@pytest.mark.parametrize(
    "message",
    [
        Work(key="ok"),
        Work(key='quo"te \\ back \u00e9\u4e2d \U0001f600', fail_times=2**70, always_fail=True),
        Work(key="", fail_times=-3, sleep=1e300),
        Work(key="x", sleep=-0.0),
    ],
)
def test_a_plain_message_is_stored_as_the_general_encoder_writes_it(message):
    general = payloads._ENCODER.encode(message)  # the path of every other value
    assert payloads.dumps_checked(Work, message, what="x") == general
    assert payloads.dumps(message) == general
    pgmsg.notify(message)
    assert payloads.load(Work, Notification.objects.get().payload) == message


@pytest.mark.parametrize(
    "message",
    [Work(key="x", fail_times=True), Work(key=5), Work(key="x", always_fail=1)],
    ids=["bool for int", "int for str", "int for bool"],
)
def test_a_value_of_another_json_type_still_gets_the_full_check(message):
    with pytest.raises(errors.PayloadError, match="cannot send on channel 'test.work'"):
        pgmsg.notify(message)
    assert Notification.objects.count() == 0


def test_an_int_for_a_float_field_is_still_accepted():
    pgmsg.notify(Work(key="x", sleep=1))
    assert Notification.objects.get().payload["sleep"] == 1


@pytest.mark.parametrize(
    "message", [Work(key="x", sleep=float("nan")), Work(key="nul \x00")], ids=["nan", "nul"]
)
def test_what_jsonb_cannot_hold_is_refused_on_the_plain_path_too(message):
    with pytest.raises(errors.PayloadError):
        pgmsg.notify(message)


def test_the_plain_encoder_writes_what_dumps_writes_or_leaves_the_value_to_it():
    """payload_encoders.plain_encoder (notify()'s first try) gives dumps' exact text for a
    value whose fields all hold their plain types, and None for anything else, which dumps and
    dumps_checked then take with their errors: so a bad value still fails where it is sent."""
    import dataclasses

    @dataclasses.dataclass
    class Plain:
        n: int
        x: float = 0.0
        s: str | None = None
        b: bool = False

    @dataclasses.dataclass
    class Sub(Plain):
        pass

    encode = payload_encoders.plain_encoder(Plain)
    for value in (Plain(1), Plain(-5, 2.5, 'é " \\ \n', True), Plain(2**70, 1e300, None)):
        assert encode(value) == payloads.dumps(value)
    left = [
        Plain(True),  # a bool in an int field
        Plain(1, 1),  # an int in a float field (dumps writes it; the check decides)
        Plain(1, float("nan")),  # JSON has no NaN
        Plain(1, 0.0, "a\x00b"),  # jsonb holds no NUL
        Plain(1, 0.0, 5),  # a wrong type
        Sub(1),  # another class than the one asked for
    ]
    assert [encode(value) for value in left] == [None] * len(left)
    assert payload_encoders.plain_encoder(Typed)(None) is None  # a class with other field types
    with pytest.raises(errors.PayloadError, match="NUL"):
        pgmsg.notify(Work(key="a\x00b"))
    with pytest.raises(errors.PayloadError, match="is not"):
        pgmsg.notify(Work(key=True))
    assert not Notification.objects.exists()
