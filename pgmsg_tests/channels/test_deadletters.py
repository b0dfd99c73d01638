"""Retries with backoff, dead letters, replay and discard (function, command)."""

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

import pgmsg
from pgmsg.channels import deadletters
from pgmsg.models import Notification, NotificationDeadLetter
from pgmsg_tests.helpers import drain, effect_counts, make_due_now
from pgmsg_tests.testapp.channels import Work

pytestmark = pytest.mark.django_db(transaction=True)


def drain_until_settled(rounds: int = 10) -> None:
    """Run the worker round after round, skipping the backoff waits between rounds."""
    for _ in range(rounds):
        drain()
        make_due_now()


def test_a_failure_is_recorded_and_retried_later_with_backoff():
    sent_id = pgmsg.notify(Work(key="flaky", fail_times=1))
    created_at = Notification.objects.get().created_at
    drain()
    row = Notification.objects.get()
    assert (row.pk, row.created_at) == (sent_id, created_at)  # the same message, put back
    assert row.state == "retrying" and row.attempts == 1
    assert "work flaky fails on attempt 1" in row.last_error
    assert row.available_at > row.last_failed_at  # not due again at once: backoff
    assert effect_counts() == {}  # the failed attempt's writes were rolled back
    make_due_now()
    drain()
    assert Notification.objects.count() == 0
    assert effect_counts() == {"flaky": 1}
    assert effect_counts(listener="second_listener") == {"flaky": 1}


def test_backoff_grows_with_each_attempt():
    pgmsg.notify(Work(key="grow", always_fail=True))
    delays = []
    for _ in range(3):
        drain()
        row = Notification.objects.get()
        delays.append((row.available_at - row.last_failed_at).total_seconds())
        make_due_now()
    # RETRY_BACKOFF=0.05 doubling (capped at 0.2), +-20 % jitter.
    assert 0.04 <= delays[0] <= 0.06 and 0.08 <= delays[1] <= 0.12 and delays[2] >= 0.16


@pytest.mark.parametrize("savepoint_per_message", [False, True])
def test_one_failure_does_not_undo_the_rest_of_the_batch(settings, savepoint_per_message):
    settings.PGMSG = {**settings.PGMSG, "SAVEPOINT_PER_MESSAGE": savepoint_per_message}
    pgmsg.notify_many([Work(key="ok1"), Work(key="bad", always_fail=True), Work(key="ok2")])
    drain()
    assert effect_counts() == {"ok1": 1, "ok2": 1}
    assert effect_counts(listener="second_listener") == {"ok1": 1, "ok2": 1}
    row = Notification.objects.get()
    assert row.payload["key"] == "bad" and row.attempts == 1 and row.state == "retrying"


def test_after_max_attempts_it_becomes_a_dead_letter_and_stays():
    doomed_id = pgmsg.notify(Work(key="doomed", always_fail=True))
    other_id = pgmsg.notify(Work(key="kept", always_fail=True))
    drain_until_settled()
    assert not Notification.objects.exists()  # both moved to the dead letters
    row = NotificationDeadLetter.objects.get(pk=doomed_id)  # with its id
    assert row.state == "dead" and row.attempts == 5  # PGMSG MAX_ATTEMPTS default
    assert row.payload["key"] == "doomed" and row.payload["always_fail"] is True
    assert "always fails" in row.last_error and row.last_failed_at is not None
    drain_until_settled(2)
    assert NotificationDeadLetter.objects.get(pk=row.pk).attempts == 5  # not claimed again
    assert list(pgmsg.dead_letters()) == [row, NotificationDeadLetter.objects.get(pk=other_id)]
    assert pgmsg.dead_letters("test.other").count() == 0


def test_a_payload_that_cannot_be_decoded_goes_dead_at_once_with_the_reason():
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgmsg_notification (channel, payload) VALUES "
            "('test.work', '{\"key\": 12}'), ('test.work', '{\"nokey\": 1}')"
        )
    drain()
    assert not Notification.objects.exists()
    rows = list(NotificationDeadLetter.objects.order_by("id"))
    assert [r.state for r in rows] == ["dead", "dead"]
    assert [r.attempts for r in rows] == [1, 1]
    assert "not retried" in rows[0].last_error
    assert "Work.key: 12 is not a valid str" in rows[0].last_error
    assert "missing field(s) ['key']" in rows[1].last_error


def test_replay_gives_a_dead_letter_fresh_attempts_and_it_is_handled():
    pgmsg.notify(Work(key="second-chance", fail_times=5))
    drain_until_settled()
    row = NotificationDeadLetter.objects.get()
    assert row.state == "dead"
    # Make the handler succeed now: replay resets attempts to 0, and fail_times=5 would fail
    # again, so rewrite the payload the way an operator fixing data would.
    NotificationDeadLetter.objects.filter(pk=row.pk).update(payload={"key": "second-chance"})
    assert pgmsg.replay([row.pk]) == 1
    assert not NotificationDeadLetter.objects.exists()
    assert Notification.objects.get().pk == row.pk
    drain()
    assert Notification.objects.count() == 0
    assert effect_counts() == {"second-chance": 1}


def test_replay_by_channel_and_discard():
    pgmsg.notify_many([Work(key=f"d{i}", always_fail=True) for i in range(3)])
    drain_until_settled()
    assert NotificationDeadLetter.objects.count() == 3 and not Notification.objects.exists()
    assert deadletters.status() == {"test.work": 3}
    assert pgmsg.replay(channel="test.work") == 3
    assert Notification.objects.filter(attempts=0).count() == 3
    assert not NotificationDeadLetter.objects.exists()
    drain_until_settled()
    ids = list(NotificationDeadLetter.objects.order_by("id").values_list("id", flat=True))
    assert pgmsg.discard(ids[:2]) == 2
    assert list(NotificationDeadLetter.objects.values_list("id", flat=True)) == ids[2:]


def test_discard_leaves_pending_notifications_alone():
    pgmsg.notify(Work(key="pending"))
    assert pgmsg.discard([Notification.objects.get().pk]) == 0
    assert Notification.objects.count() == 1


def test_deadletters_command_lists_replays_and_discards():
    pgmsg.notify_many([Work(key="c1", always_fail=True), Work(key="c2", always_fail=True)])
    drain_until_settled()
    first, second = NotificationDeadLetter.objects.order_by("id").values_list("id", flat=True)
    out = StringIO()
    call_command("pgmsg_deadletters", "list", stdout=out)
    assert f"{first}\ttest.work\tattempts=5" in out.getvalue()
    assert "always fails" in out.getvalue()
    out = StringIO()
    call_command("pgmsg_deadletters", "replay", str(first), stdout=out)
    assert "replay: 1 notification(s)" in out.getvalue()
    call_command("pgmsg_deadletters", "discard", "--channel", "test.work", stdout=StringIO())
    assert list(Notification.objects.values_list("id", flat=True)) == [first]
    assert not NotificationDeadLetter.objects.exists()
    with pytest.raises(CommandError, match="give notification ids, --channel NAME or --inbox"):
        call_command("pgmsg_deadletters", "discard")


def test_an_undecodable_payload_fails_alone_when_its_row_runs_and_the_others_run_once():
    # The worker decodes a batch's payloads while its claim record travels
    # (NotificationSource._decoded): a payload that does not decode must still fail its own
    # row only, when that row runs, as if decoded there.
    pgmsg.notify_many([Work(key="a"), Work(key="b")])
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgmsg_notification (channel, payload) "
            """VALUES ('test.work', '{"key": 5}'), ('test.work', '{"key": "c", "x": 1}')"""
        )
    pgmsg.notify(Work(key="d"))
    drain_until_settled()
    assert effect_counts() == {"a": 1, "b": 1, "d": 1}
    assert effect_counts(listener="second_listener") == {"a": 1, "b": 1, "d": 1}
    assert not Notification.objects.exists()
    dead = list(NotificationDeadLetter.objects.order_by("id"))
    assert [(n.state, n.attempts) for n in dead] == [("dead", 1), ("dead", 1)]
    assert "Work.key: 5 is not a valid str" in dead[0].last_error
    assert "unknown field(s) ['x']" in dead[1].last_error
