"""The read horizon: open transactions of other databases do not hold subscriptions back, and
what does hold them back is named."""

from __future__ import annotations

import io

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection

import pgmsg
from pgmsg.core import horizon
from pgmsg.events import reads
from pgmsg_tests.conftest import wait_for
from pgmsg_tests.events.test_subscriptions_processes import start_ready
from pgmsg_tests.testapp.events_handlers import Step
from pgmsg_tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def open_writing_transaction(dbname: str) -> psycopg.Connection:
    """A session of ``dbname`` on the test server, idle in a transaction that has an id."""
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
        params.pop(key, None)
    conn = psycopg.connect(**{**params, "dbname": dbname})
    conn.execute("SELECT pg_current_xact_id()")
    return conn


@pytest.mark.processes
def test_an_open_transaction_in_another_database_does_not_hold_a_subscription_back(workers):
    start_ready(workers, "--subscription", "test-seq")
    other = open_writing_transaction("postgres")
    try:
        for n in range(5):
            pgmsg.append(f"seq-h{n}", Step(n=1))
        wait_for(
            lambda: Effect.objects.filter(channel="sub.seq").count() == 5,
            timeout=30,
            message="the subscription handles events while another database's transaction "
            "stays open",
        )
    finally:
        other.close()


def test_with_no_transaction_in_progress_the_horizon_is_the_next_transaction_id():
    """Nothing holds it back: the horizon is where the next transaction id will be (taken from
    the snapshot alone, migration 0022, or from the sessions, migration 0018: the same)."""

    def next_id(cursor) -> int:
        cursor.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
        return cursor.fetchone()[0]

    with connection.cursor() as cursor:
        before = next_id(cursor)
        held = horizon.horizon(cursor)
        after = next_id(cursor)
    assert before <= held <= after


def test_an_open_writing_transaction_here_holds_the_horizon_back_and_is_named(monkeypatch):
    blocker = open_writing_transaction(connection.settings_dict["NAME"])
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT %s::text::bigint", [blocker.info.backend_pid])
            held = horizon.horizon(cursor)
            cursor.execute(
                "SELECT backend_xid::text::bigint FROM pg_stat_activity WHERE pid = %s",
                [blocker.info.backend_pid],
            )
            blocker_xid = cursor.fetchone()[0]
        assert held % 2**32 == blocker_xid  # held at the open transaction's id
        monkeypatch.setattr(horizon, "BLOCKED_AFTER", 0.0)
        (found,) = reads.horizon_blockers()
        assert found.pid == blocker.info.backend_pid
        assert found.database == connection.settings_dict["NAME"]
        assert found.state == "idle in transaction"
        out = io.StringIO()
        call_command("pgmsg_subscriptions", "status", stdout=out)
        assert f"read horizon held back by pid {blocker.info.backend_pid}" in out.getvalue()
        assert "idle in transaction" in out.getvalue()
    finally:
        blocker.close()
    wait_for(lambda: reads.horizon_blockers() == [], timeout=30, message="blocker gone")


def test_the_admin_names_what_holds_the_horizon_back(client):
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("watcher", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["view_overview", "view_subscriptionpartition"])
    )
    client.force_login(user)
    pages = ["/admin/pgmsg/overview/", "/admin/pgmsg/subscriptionpartition/"]
    blocker = open_writing_transaction(connection.settings_dict["NAME"])
    blocker.execute("SELECT 'card 4242-secret' AS quoted_data")  # the session's last query
    pid = blocker.info.backend_pid
    try:
        # Named once it has held the horizon for horizon.BLOCKED_AFTER seconds.
        overview = wait_for(
            lambda: (
                "Read horizon held back" in (body := client.get(pages[0]).content.decode()) and body
            ),
            timeout=30,
            message="the overview names the blocker",
        )
        assert f"<td>{pid}</td>" in overview
        assert f"<td>{connection.settings_dict['NAME']}</td>" in overview
        assert "idle in transaction" in overview
        # Its query text may quote any table's data: the overview permission does not show it.
        assert "4242-secret" not in overview
        client.force_login(User.objects.create_superuser("root", password="pw"))
        assert "4242-secret" in client.get(pages[0]).content.decode()
        client.force_login(user)
        partitions = client.get(pages[1]).content.decode()
        assert f"Read horizon held back by pid {pid} on database" in partitions
        assert "idle in transaction" in partitions
        assert "4242-secret" not in partitions
    finally:
        blocker.close()
    wait_for(lambda: reads.horizon_blockers() == [], timeout=30, message="blocker gone")
    for page in pages:
        assert "Read horizon held back" not in client.get(page).content.decode()


def test_reset_to_the_end_passes_over_what_is_stored_while_another_database_is_held():
    """ "end" is the readers' horizon, not the server-wide xmin: an open transaction of another
    database held the server's xmin below this test's events, and a reset to that point
    replayed every one of them."""
    from pgmsg.events import subscription_operations
    from pgmsg_tests.events.test_subscriptions import drain, drain_until, effects

    other = open_writing_transaction("postgres")
    try:
        pgmsg.append("seq-e", [Step(n=i) for i in range(1, 6)])
        drain_until("test-seq", lambda: len(effects("sub.seq")) == 5, message="5 handled")
        subscription_operations.reset("test-seq", to="end")
        pgmsg.append("seq-e", Step(n=6))
        drain_until("test-seq", lambda: len(effects("sub.seq")) >= 6, message="the new one")
        drain("test-seq")
        assert [e.data["n"] for e in effects("sub.seq")] == [1, 2, 3, 4, 5, 6]
    finally:
        other.close()


def test_a_subscription_starting_now_passes_over_what_is_stored_while_another_db_is_held():
    from pgmsg_tests.events.test_subscriptions import drain, drain_until, effects

    other = open_writing_transaction("postgres")
    try:
        pgmsg.append("late-h", Step(n=1))
        drain("test-late")  # creates the partition at the horizon: step 1 is passed over
        pgmsg.append("late-h", Step(n=2))
        drain_until("test-late", lambda: effects("sub.late"), message="the new event")
        drain("test-late")
        assert [e.data["n"] for e in effects("sub.late")] == [2]
    finally:
        other.close()
