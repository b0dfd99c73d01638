"""Channel declarations, names and payload (de)serialisation."""

import dataclasses
import datetime as dt
import json
import uuid
from decimal import Decimal

import pytest

import pgmsg
from pgmsg.channels import declarations as channels
from pgmsg.core import errors, names, payloads
from pgmsg_tests.testapp.channels import Colour, Typed, Work


def test_declared_channel_is_a_dataclass_with_its_spec():
    message = Work(key="a")
    assert message.fail_times == 0
    assert Work.pgmsg_channel.name == "test.work"
    assert Work.pgmsg_channel.delivery == pgmsg.EXACTLY_ONCE
    assert Typed.pgmsg_channel.max_attempts == 2


def test_default_name_is_snake_case_of_the_class():
    class ParcelShipped(pgmsg.Channel):
        parcel_id: int

    assert ParcelShipped.pgmsg_channel.name == "parcel_shipped"
    del channels.registry.channels["parcel_shipped"]


@pytest.mark.parametrize(
    "name", ["", "Upper", "1starts_with_digit", "has space", "quote'd", "semi;colon", "x" * 58, 7]
)
def test_bad_channel_names_are_refused_with_the_name_quoted(name):
    with pytest.raises(errors.InvalidName, match="invalid channel name"):
        names.validate_name(name)


def test_a_name_declared_twice_is_refused():
    with pytest.raises(errors.ChannelAlreadyRegistered, match="test.work"):

        class Other(pgmsg.Channel, name="test.work"):
            key: str


def test_unsupported_field_types_are_refused_at_declaration():
    with pytest.raises(errors.ConfigurationError, match="cannot be carried"):

        class Bad(pgmsg.Channel, name="test.bad-type"):
            handle: object.__class__  # a type object is not JSON


def test_bad_delivery_is_refused():
    with pytest.raises(errors.ConfigurationError, match="delivery must be"):

        class Bad(pgmsg.Channel, name="test.bad-delivery", delivery="sometimes"):
            key: str


def test_typed_payload_round_trips_exactly():
    message = Typed(
        when=dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC),
        day=dt.date(2026, 2, 3),
        amount=Decimal("12345678901234567890.12345"),
        ident=uuid.uuid4(),
        colour=Colour.BLUE,
        tags=["a", "b"],
        extra={"n": 1},
    )
    import json

    back = payloads.load(Typed, json.loads(payloads.dumps(message)))
    assert back == message
    assert isinstance(back.amount, Decimal) and isinstance(back.ident, uuid.UUID)


@pytest.mark.parametrize(
    "data, complaint",
    [
        ({"key": 5}, r"Work.key: 5 is not a valid str"),
        ({}, r"missing field\(s\) \['key'\]"),
        ({"key": "a", "surprise": 1}, r"unknown field\(s\) \['surprise'\]"),
        ({"key": "a", "fail_times": "two"}, r"Work.fail_times: 'two' is not a valid int"),
        ([1, 2], r"expected a JSON object"),
    ],
)
def test_bad_payloads_get_precise_errors(data, complaint):
    with pytest.raises(errors.PayloadError, match=complaint):
        payloads.load(Work, data)


def test_values_json_cannot_hold_are_refused_on_send():
    with pytest.raises(errors.PayloadError, match="cannot encode"):
        payloads.dumps(Work(key=float("nan")))


@dataclasses.dataclass
class PlainValues:
    text: str
    count: int
    share: float
    flag: bool
    note: str | None = None


def test_plain_payloads_encode_as_json_does_and_refuse_what_it_refuses():
    value = PlainValues('é " \\ \n \u2028 \x7f', 2**70, 0.1, True)
    assert payloads._plain_dict(value) is not None  # the encoder made once (payloads.py)
    expected = json.dumps(dataclasses.asdict(value), separators=(",", ":"), allow_nan=False)
    assert payloads.dumps(value) == expected
    assert payloads.dumps(PlainValues("", -1, -0.0, False, "x")) == (
        '{"text":"","count":-1,"share":-0.0,"flag":false,"note":"x"}'
    )
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(errors.PayloadError, match="cannot encode"):
            payloads.dumps(PlainValues("x", 1, bad, False))


def test_notify_refuses_what_is_not_a_channel_message():
    with pytest.raises(errors.UnknownChannel, match="not an instance of a declared"):
        pgmsg.notify({"key": "a"})


def test_listener_of_an_invalid_name_is_refused():
    with pytest.raises(errors.InvalidName):
        pgmsg.listener("Bad Name")


def test_trigger_channel_names_are_validated():
    import pgtrigger

    with pytest.raises(errors.InvalidName, match="invalid channel name 'Bad;name'"):
        pgmsg.ChannelTrigger(channel="Bad;name", operation=pgtrigger.Insert)


def test_trigger_channels_are_registered_with_their_model():
    from pgmsg_tests.testapp.models import Order

    spec = channels.registry.get("order_changed")
    assert spec.is_trigger and spec.model is Order and spec.delivery == pgmsg.EXACTLY_ONCE


@pytest.mark.parametrize(
    "data, expected",
    [
        # Every field, each of its exact type: the loader made for the class builds it.
        (
            {"text": "a", "count": 1, "share": 0.5, "flag": True, "note": None},
            PlainValues("a", 1, 0.5, True, None),
        ),
        ({"text": "a", "count": 1, "share": 0.5, "flag": True, "note": "n"}, None),
        # The checked path: a default left out, an int for a float.
        ({"text": "a", "count": 1, "share": 0.5, "flag": False}, PlainValues("a", 1, 0.5, False)),
        ({"text": "a", "count": 1, "share": 2, "flag": False}, PlainValues("a", 1, 2.0, False)),
    ],
)
def test_plain_payloads_decode_alike_on_either_path(data, expected):
    expected = expected or PlainValues(**data)
    loaded = payloads.load(PlainValues, data)
    assert loaded == expected
    assert type(loaded.share) is float
    # The worker's decoder (jsonb text to the instance) gives the same.
    decoded = payloads.jsonb_decoder(PlainValues)(json.dumps(data))
    assert decoded == expected
    assert type(decoded.share) is float


@pytest.mark.parametrize(
    "data, complaint",
    [
        ({"text": "a", "count": True, "share": 0.5, "flag": True, "note": None}, "count: True"),
        ({"text": "a", "count": 1, "share": 0.5, "flag": 1, "note": None}, "flag: 1"),
        ({"text": "a", "count": 1, "share": 0.5, "flag": True, "other": None}, "unknown field"),
        ({"text": 1, "count": 1, "share": 0.5, "flag": True, "note": None}, "text: 1"),
    ],
)
def test_plain_payloads_with_a_wrong_value_get_the_checked_paths_error(data, complaint):
    """Same number of keys as fields, so the loader made for the class looks first: a
    bool is not an int to it (nor an int a bool), and a wrong name is not a field."""
    with pytest.raises(errors.PayloadError, match=complaint):
        payloads.load(PlainValues, data)
    with pytest.raises(errors.PayloadError, match=complaint):
        payloads.jsonb_decoder(PlainValues)(json.dumps(data))


@pytest.mark.parametrize("text", ["", "{", '{"text": "a",}', "[1] x", "nan"])
def test_the_workers_decoder_says_when_text_is_not_json(text):
    with pytest.raises(errors.PayloadError, match="payload is not JSON"):
        payloads.jsonb_decoder(PlainValues)(text)
