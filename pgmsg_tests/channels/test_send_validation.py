"""Sending validates against the declared types: the error reaches the code that sent."""

import pytest
from django.test import override_settings

import pgmsg
from pgmsg.core import errors
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
    }
