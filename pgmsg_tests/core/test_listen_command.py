"""manage.py listen: argument errors are clear, and --until-idle drains and exits."""

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import pgmsg
from pgmsg_tests.helpers import effect_counts
from pgmsg_tests.testapp.channels import Work


@pytest.mark.parametrize(
    "args, complaint",
    [
        (["--processes", "0"], "--processes must be at least 1"),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
        (["--partition", "3/2"], "need 0 <= i < N"),
        (["--partition", "x"], "must look like i/N"),
        (["no.such.channel"], "no channel named 'no.such.channel'"),
        (["test.unheard"], "has no listener"),
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(args, complaint):
    with pytest.raises(CommandError, match=complaint):
        call_command("listen", *args)


@pytest.mark.django_db(transaction=True)
def test_until_idle_handles_what_is_due_and_returns():
    pgmsg.notify_many(Work(key=f"u{i}") for i in range(30))
    call_command("listen", "test.work", "--until-idle", "--batch-size", "7", verbosity=0)
    assert effect_counts() == {f"u{i}": 1 for i in range(30)}
