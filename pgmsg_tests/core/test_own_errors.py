"""A message's stored error is its own (issue 44, item 1): when several messages of one batch
fail, each keeps its own exception and traceback, never another message's, nor pgmsg's
re-run machinery (batch.Redo) chained in front of it."""

import pytest
from django.db import transaction

import pgmsg
from pgmsg.core import batch
from pgmsg.core.worker import Worker
from pgmsg.models import InboxMessage, Notification, SubscriptionPartition
from pgmsg_tests.inbox.helpers import drain as drain_inbox
from pgmsg_tests.testapp.channels import Work
from pgmsg_tests.testapp.events_handlers import Step
from pgmsg_tests.testapp.inbox_models import WebhookEvent

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = [f"own-{name}" for name in "abcdefgh"]  # none is a part of another


def assert_own(errors: dict[str, str], own_text) -> None:
    """``errors``: {key: stored error}; each holds its own text and nobody else's."""
    assert sorted(errors) == sorted(KEYS)
    for key, error in errors.items():
        assert own_text(key) in error, error
        assert not [other for other in KEYS if other != key and other in error], error
        assert "Redo" not in error and "During handling" not in error, error
        assert "The above exception was the direct cause" not in error, error


def test_channel_messages_keep_their_own_errors():
    with transaction.atomic():  # one batch
        pgmsg.notify_many(Work(key=key, always_fail=True) for key in KEYS)
    Worker(channel_names=["test.work"], until_idle=True, install_signal_handlers=False).run()
    errors = dict(Notification.objects.values_list("payload__key", "last_error"))
    assert_own(errors, lambda key: f"RuntimeError: work {key} always fails")


@pytest.mark.parametrize("inbox", ["test.inbox", "test.ordered"])
def test_inbox_messages_keep_their_own_errors(inbox):
    with transaction.atomic():
        for i, key in enumerate(KEYS):
            message_type = "step" if inbox == "test.ordered" else "work"
            # Ordered: one aggregate each, so that every one of them runs and fails.
            pgmsg.receive(
                inbox,
                key,
                type=message_type,
                payload={"fail_times": 9, "seq": 0},
                aggregate_id=f"agg-{i}",
            )
    drain_inbox(inbox)
    errors = dict(InboxMessage.objects.filter(inbox=inbox).values_list("message_id", "last_error"))
    assert_own(errors, lambda key: f"RuntimeError: {key} fails on attempt 1")


def test_model_inbox_messages_keep_their_own_errors():
    with transaction.atomic():
        for key in KEYS:
            WebhookEvent.objects.create(event_id=key, kind="charge", body={"fail_times": 9})
    Worker(inboxes=["test.webhooks"], until_idle=True, install_signal_handlers=False).run()
    errors = dict(
        InboxMessage.objects.filter(inbox="test.webhooks").values_list("message_id", "last_error")
    )
    assert_own(errors, lambda key: f"RuntimeError: {key} fails on attempt 1")


def test_a_subscription_keeps_the_event_s_own_error():
    pgmsg.append("fragile-a", [Step(n=1), Step(n=2, fail=True, tag="own")])
    Worker(subscriptions=["test-fragile"], until_idle=True, install_signal_handlers=False).run()
    [row] = SubscriptionPartition.objects.filter(subscription="test-fragile").exclude(last_error="")
    assert "RuntimeError: step 2 of fragile-a fails" in row.last_error
    assert "Redo" not in row.last_error and "During handling" not in row.last_error


def test_a_stored_error_keeps_the_handler_s_own_chain_but_never_a_redo():
    try:
        try:
            raise batch.Redo("a handler failed on the fast path: another message's error")
        except batch.Redo:
            try:
                raise KeyError("its own cause")
            except KeyError as cause:
                raise ValueError("its own error") from cause
    except ValueError as exc:
        text = batch.describe_error(exc)
    assert "ValueError: its own error" in text and "KeyError: 'its own cause'" in text
    assert "Redo" not in text and "another message" not in text
    assert "During handling" not in text
