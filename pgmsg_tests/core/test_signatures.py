"""The HMAC-SHA256 signatures shared by the HTTP destination and the webhook receiver."""

from __future__ import annotations

import hashlib
import hmac
import time

import pytest

from pgmsg.core import errors, signatures

BODY = b'{"n": 1}'


def headers_of(found: dict[str, str]):
    lowered = {k.lower(): v for k, v in found.items()}
    return lambda name: lowered.get(name.lower())


def test_pgmsgs_signature_is_the_hmac_of_timestamp_dot_body():
    signed = signatures.sign("s3cret", BODY, timestamp=1700000000)
    expected = hmac.new(b"s3cret", b"1700000000." + BODY, hashlib.sha256).hexdigest()
    assert signed == {"pgmsg-timestamp": "1700000000", "pgmsg-signature": f"v1={expected}"}


def test_a_signed_body_verifies_and_any_change_does_not():
    scheme = signatures.Scheme()
    signed = signatures.sign("s3cret", BODY)
    signatures.verify(scheme, headers_of(signed), BODY, ["s3cret"])
    for body, secrets in ((b'{"n": 2}', ["s3cret"]), (BODY, ["other"])):
        with pytest.raises(errors.InvalidSignature, match="does not match"):
            signatures.verify(scheme, headers_of(signed), body, secrets)


def test_a_timestamp_outside_the_tolerance_is_refused_either_way():
    scheme = signatures.Scheme(tolerance=60)
    for skew in (-61, 61):
        signed = signatures.sign("s3cret", BODY, timestamp=int(time.time()) + skew)
        with pytest.raises(errors.InvalidSignature, match="tolerance 60s"):
            signatures.verify(scheme, headers_of(signed), BODY, ["s3cret"])


def test_missing_and_malformed_headers_are_refused_without_a_crash():
    scheme = signatures.Scheme()
    cases = [
        ({}, "no pgmsg-signature header"),
        ({"pgmsg-signature": "v1=abc"}, "no timestamp"),
        ({"pgmsg-signature": "v1=abc", "pgmsg-timestamp": "yesterday"}, "no timestamp"),
        ({"pgmsg-signature": "v1=abc", "pgmsg-timestamp": "\u00b2"}, "no timestamp"),
        ({"pgmsg-signature": "v0=abc", "pgmsg-timestamp": str(int(time.time()))}, "no v1="),
        ({"pgmsg-signature": "v1=\xe9\xff", "pgmsg-timestamp": str(int(time.time()))}, "match"),
    ]
    for found, reason in cases:
        with pytest.raises(errors.InvalidSignature, match=reason):
            signatures.verify(scheme, headers_of(found), BODY, ["s3cret"])


def test_rotation_any_given_signature_against_any_known_secret():
    scheme = signatures.Scheme()
    now = int(time.time())
    new = signatures.sign("new", BODY, timestamp=now)["pgmsg-signature"]
    old = signatures.sign("old", BODY, timestamp=now)["pgmsg-signature"]
    found = {"pgmsg-timestamp": str(now), "pgmsg-signature": f"{old},{new}"}
    signatures.verify(scheme, headers_of(found), BODY, ["new"])
    signatures.verify(scheme, headers_of({**found, "pgmsg-signature": old}), BODY, ["new", "old"])


def test_stripe_style_carries_the_timestamp_in_the_signature_header():
    scheme = signatures.Scheme(format="stripe")
    now = int(time.time())
    mac = signatures.digest("whsec_x", f"{now}.".encode() + BODY)
    found = {"Stripe-Signature": f"t={now},v1={mac},v0=ignored"}
    signatures.verify(scheme, headers_of(found), BODY, ["whsec_x"])
    stale = {"Stripe-Signature": f"t={now - 301},v1={mac}"}
    with pytest.raises(errors.InvalidSignature, match="tolerance"):
        signatures.verify(scheme, headers_of(stale), BODY, ["whsec_x"])


def test_github_style_signs_the_body_alone():
    scheme = signatures.Scheme(format="github")
    found = {"X-Hub-Signature-256": "sha256=" + signatures.digest("gh", BODY)}
    signatures.verify(scheme, headers_of(found), BODY, ["gh"])
    with pytest.raises(errors.InvalidSignature, match="sha256=<hex>"):
        signatures.verify(scheme, headers_of({"X-Hub-Signature-256": "sha1=ab"}), BODY, ["gh"])


def test_header_names_are_configurable():
    scheme = signatures.Scheme(signature_header="X-Sig", timestamp_header="X-Time")
    signed = signatures.sign("s", BODY)
    found = {"X-Sig": signed["pgmsg-signature"], "X-Time": signed["pgmsg-timestamp"]}
    signatures.verify(scheme, headers_of(found), BODY, ["s"])


def test_an_unknown_format_is_a_configuration_error():
    with pytest.raises(errors.ConfigurationError, match="'slack'"):
        signatures.Scheme(format="slack")
