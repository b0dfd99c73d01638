"""The operators' commands: one vocabulary, true usage lines, plain answers when empty."""

import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import pgmsg
from pgmsg.models import InboxMessage, NotificationDeadLetter
from pgmsg_tests.conftest import ROOT, WorkerProcesses
from pgmsg_tests.helpers import dead_letter

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> StringIO:
    out = StringIO()
    call_command(*args, stdout=out)
    return out


def test_an_empty_dead_letter_list_says_so():
    assert run("pgmsg_deadletters", "list").getvalue() == "no dead letters\n"
    assert run("pgmsg_deadletters", "status").getvalue() == "no dead letters\n"


def test_dead_letters_of_channels_and_inboxes_in_one_list_and_status():
    note = dead_letter(channel="test.work", payload={}, attempts=5, last_error="x\nValueError: a")
    msg = InboxMessage.objects.create(
        inbox="test.inbox", message_id="m1", type="t", payload={}, status="dead", attempts=3
    )
    listing = run("pgmsg_deadletters", "list").getvalue()
    assert f"{note.id}\ttest.work\tattempts=5\tValueError: a" in listing
    assert f"{msg.id}\tinbox test.inbox\tm1\tt\tattempts=3" in listing
    assert run("pgmsg_deadletters", "list", "--channel", "test.work").getvalue().count("\n") == 1
    assert run("pgmsg_deadletters", "list", str(note.id)).getvalue().count("\n") == 1
    by_inbox = run("pgmsg_deadletters", "list", "--inbox", "test.inbox", str(msg.id)).getvalue()
    assert by_inbox.startswith(f"{msg.id}\tinbox test.inbox") and by_inbox.count("\n") == 1
    assert run("pgmsg_deadletters", "status").getvalue().splitlines() == [
        "channel test.work\tdead=1",
        "inbox test.inbox\tdead=1",
    ]
    run("pgmsg_deadletters", "replay", "--inbox", "test.inbox")
    assert InboxMessage.objects.get(pk=msg.pk).status == "pending"
    run("pgmsg_deadletters", "discard", "--channel", "test.work")
    assert not NotificationDeadLetter.objects.exists()


def test_the_usage_line_says_list_needs_no_ids():
    env = WorkerProcesses(ROOT).env()
    done = subprocess.run(
        [sys.executable, "-m", "django", "pgmsg_deadletters"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "{list,status,replay,discard}" in done.stderr
    assert "required: action, ids" not in done.stderr


def test_inbox_status_exits_zero_when_healthy():
    run("pgmsg_inbox", "status", "test.inbox")  # raises CommandError when degraded
    assert run("pgmsg_inbox", "list").getvalue() == "no dead messages\n"


def test_every_operating_command_offers_the_shared_verbs():
    from pgmsg.management.commands import pgmsg_deadletters, pgmsg_inbox, pgmsg_subscriptions

    def verbs(module) -> set[str]:
        parser = module.Command().create_parser("manage.py", module.__name__.rsplit(".", 1)[1])
        for action in parser._actions:
            if action.dest == "action":
                return set(action.choices)
        raise AssertionError(f"{module.__name__} has no action argument")

    assert {"list", "status", "replay", "discard"} <= verbs(pgmsg_deadletters)
    assert {"list", "status", "replay", "discard"} <= verbs(pgmsg_inbox)
    assert {"list", "status", "reset", "skip", "retry"} <= verbs(pgmsg_subscriptions)
    assert pgmsg.discard and pgmsg.replay  # the functions the commands call


VERBS = ["status", "list", "replay", "discard", "retry", "skip", "reset"]


def test_docs_table_names_every_verb_once_in_order():
    text = (ROOT / "docs" / "operations.md").read_text()
    table = text.split("## The verbs", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == VERBS


def test_commands_and_admin_actions_only_call_the_operations():
    # Each verb has one implementation, in the capability; the thin layers hold no SQL and
    # write no rows themselves.
    thin = [
        *(ROOT / "pgmsg" / "management" / "commands").glob("pgmsg_*.py"),
        *(ROOT / "pgmsg" / "admin").glob("*.py"),
    ]
    for path in thin:
        if path.name.startswith("overview"):
            continue  # the overview's read-only metrics, not an operation
        source = path.read_text()
        for needle in ("cursor", ".update(", ".delete(", "QUERIES", "execute("):
            assert needle not in source, f"{path.name} uses {needle!r}"


NOT_THERE = "999999"


@pytest.mark.parametrize("verb", ["replay", "discard"])
def test_ids_that_match_nothing_exit_non_zero_naming_them(verb):
    note = dead_letter(channel="test.work", payload={}, attempts=5, last_error="x")
    with pytest.raises(CommandError, match=f"{verb}: no dead .*id\\(s\\) {NOT_THERE}; nothing"):
        run("pgmsg_deadletters", verb, str(note.id), NOT_THERE)
    assert NotificationDeadLetter.objects.filter(pk=note.pk).exists()  # nothing done
    with pytest.raises(CommandError, match=f"inbox test.inbox has id\\(s\\) {NOT_THERE};"):
        run("pgmsg_deadletters", verb, "--inbox", "test.inbox", NOT_THERE)
    with pytest.raises(CommandError, match=f"outbox message has id\\(s\\) {NOT_THERE};"):
        run("pgmsg_outbox", verb, NOT_THERE)


def test_an_inbox_row_named_without_inbox_gets_the_hint():
    msg = InboxMessage.objects.create(
        inbox="test.inbox", message_id="m1", type="t", payload={}, status="dead", attempts=3
    )
    with pytest.raises(CommandError) as raised:
        run("pgmsg_deadletters", "replay", str(msg.id))
    assert f"id {msg.id} is a message of inbox test.inbox: add --inbox test.inbox" in str(
        raised.value
    )
    with pytest.raises(CommandError, match="add --inbox test.inbox"):
        run("pgmsg_deadletters", "discard", "--inbox", "test.ordered", str(msg.id))
    assert InboxMessage.objects.get(pk=msg.pk).status == "dead"


def test_a_bad_selection_exits_non_zero_from_the_command_line():
    done = subprocess.run(
        [sys.executable, "-m", "django", "pgmsg_outbox", "discard", NOT_THERE],
        cwd=ROOT,
        env=WorkerProcesses(ROOT).env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert NOT_THERE in done.stderr and "Traceback" not in done.stderr


def test_a_cli_discard_records_a_reason(caplog):
    msg = InboxMessage.objects.create(
        inbox="test.inbox", message_id="m1", type="t", payload={}, status="dead", attempts=3
    )
    run("pgmsg_deadletters", "discard", "--inbox", "test.inbox", str(msg.id))
    assert InboxMessage.objects.get(pk=msg.pk).discard_reason == (
        "discarded with manage.py pgmsg_deadletters"
    )
    note = dead_letter(channel="test.work", payload={}, attempts=5, last_error="x")
    run("pgmsg_deadletters", "discard", str(note.id), "--reason", "ticket 12")
    assert "ticket 12 (discarded with manage.py pgmsg_deadletters)" in caplog.text
    published = pgmsg.publish("test.recorded", {"a": 1}, type="t")
    run("pgmsg_outbox", "discard", str(published.id))
    assert f"[{published.id}]: discarded with manage.py pgmsg_outbox" in caplog.text


def test_replay_and_discard_of_found_ids_still_work():
    note = dead_letter(channel="test.work", payload={}, attempts=5, last_error="x")
    assert (
        "replay: 1 notification(s)" in run("pgmsg_deadletters", "replay", str(note.id)).getvalue()
    )
    published = pgmsg.publish("test.recorded", {"a": 1}, type="t")
    assert "discard: 1 message(s)" in run("pgmsg_outbox", "discard", str(published.id)).getvalue()
