"""Operators see how far each partition is behind the head and what it handled last."""

import re
from io import StringIO

import pytest
from django.core.management import call_command

import pgmsg
from pgmsg.events import subscription_operations as subscriptions
from pgmsg_tests.events.test_subscriptions import drain_until, effects, partition_of
from pgmsg_tests.testapp.events_handlers import Deposited, Opened

pytestmark = pytest.mark.django_db(transaction=True)


def status_lines() -> dict[int, str]:
    out = StringIO()
    call_command("pgmsg_subscriptions", "status", "test-ledger", stdout=out)
    return {int(line.split("\t")[1]): line for line in out.getvalue().splitlines()}


def test_status_shows_lag_in_events_and_time_and_the_last_handled_position():
    mine = partition_of("account-1", 2)
    pgmsg.append("account-1", [Opened(owner="a"), Deposited(amount=1), Deposited(amount=2)])
    drain_until("test-ledger", lambda: len(effects("sub.ledger")) == 2, message="2 deposits")
    last = pgmsg.read_stream("account-1")[-1].position

    lines = status_lines()
    assert f"\tbehind=0 (caught up)\tlast_handled={last}\thandled=2\t" in lines[mine]
    assert "\tlast_handled=-\t" in lines[1 - mine]  # nothing of its own handled yet
    assert "checkpoint=" not in "".join(lines.values())

    pgmsg.append("account-1", [Deposited(amount=3), Opened(owner="b"), Deposited(amount=4)])
    lines = status_lines()
    assert "\tbehind=2 events, " in lines[mine] and "s behind\t" in lines[mine]
    assert f"\tlast_handled={last}\t" in lines[mine]
    (row,) = [r for r in subscriptions.status("test-ledger") if r.partition == mine]
    lag = subscriptions.lag(row)
    assert lag.behind == 2 and lag.behind_seconds >= 0 and lag.last_handled_position == last


def test_list_names_only_partitions_that_need_an_operator():
    out = StringIO()
    call_command("pgmsg_subscriptions", "list", stdout=out)
    assert out.getvalue().strip() == "no partition is stopped or retrying"


def test_the_admin_partition_list_shows_the_lag_and_the_last_handled_position(client):
    from django.contrib.auth.models import User

    mine = partition_of("account-1", 2)
    pgmsg.append("account-1", [Opened(owner="a"), Deposited(amount=1)])
    drain_until("test-ledger", lambda: len(effects("sub.ledger")) == 1, message="1 deposit")
    last = pgmsg.read_stream("account-1")[-1].position
    pgmsg.append("account-1", [Deposited(amount=2)])

    client.force_login(User.objects.create_superuser("root", password="pw"))
    page = client.get("/admin/pgmsg/subscriptionpartition/?subscription=test-ledger")
    html = page.content.decode()
    assert "Behind the head" in html and "Last handled position" in html
    behind = re.findall(r'<td class="field-behind">(.*?)</td>', html)
    handled = re.findall(r'<td class="field-last_handled">(.*?)</td>', html)
    assert behind[mine].startswith("1 event") and "s behind" in behind[mine]
    assert handled[mine] == str(last) and handled[1 - mine] == "-"
