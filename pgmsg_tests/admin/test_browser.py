"""The admin overview and dead-letter pages in a real browser (Playwright driving Debian's
Chromium) against a live server: log in, read, replay, discard with a reason, permissions.

PGMSG_SCREENSHOTS=docs saves the screenshots of docs/ (admin-overview.png,
admin-deadletter.png) from this run.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

import pgmsg
from pgmsg.models import InboxMessage, Notification, NotificationDeadLetter, Throughput
from pgmsg_tests.conftest import ROOT, skip_unless
from pgmsg_tests.helpers import drain, make_due_now
from pgmsg_tests.testapp.channels import Work

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PASSWORD = "a-long-test-password"


@pytest.fixture(scope="module")
def browser():
    skip_unless(sync_playwright is not None, "playwright is not installed (pip install -e .[dev])")
    skip_unless(
        CHROMIUM is not None,
        "Debian's Chromium is not installed: apt-get install chromium (.ci/run installs it)",
    )
    # Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
    # between page actions are plain synchronous calls all the same.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        yield launched
        launched.close()
    del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(viewport={"width": 1280, "height": 800}, base_url=live_server.url)
    yield context.new_page()
    context.close()


def user(name: str, *codenames: str, superuser: bool = False) -> User:
    if superuser:
        return User.objects.create_superuser(name, password=PASSWORD)
    made = User.objects.create_user(name, password=PASSWORD, is_staff=True)
    made.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return made


def log_in(page, username: str) -> None:
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    expect(page.locator("#site-name")).to_be_visible()


@pytest.fixture
def dead_letters():
    """One dead notification (through real failed attempts), one dead inbox message, one
    pending notification, and handled messages that the workers counted."""
    pgmsg.notify(
        Work(key="order-1042", always_fail=True, sleep=0.0),
    )
    for _ in range(5):
        drain("test.work")
        make_due_now()
    pgmsg.notify_many(Work(key=f"ok-{i}") for i in range(40))
    drain("test.work")
    pgmsg.receive(
        "test.inbox",
        "evt_3QxB7",
        type="work",
        payload={"fail_times": 99, "order": {"id": 1042, "lines": [{"sku": "SKU-1", "qty": 2}]}},
    )
    for _ in range(3):
        pgmsg.Worker(inboxes=["test.inbox"], until_idle=True, install_signal_handlers=False).run()
        InboxMessage.objects.filter(status="pending").update(available_at=timezone.now())
    pgmsg.notify(Work(key="waiting"))
    dead = NotificationDeadLetter.objects.get()
    inbox_dead = InboxMessage.objects.get(status="dead")
    return dead, inbox_dead


def seed_history() -> None:
    """Earlier minutes of the last hour, so that the chart has a shape (the minute of this
    test's own handling is real)."""
    now = timezone.now().replace(second=0, microsecond=0)
    Throughput.objects.bulk_create(
        Throughput(
            minute=now - dt.timedelta(minutes=m),
            kind="notification",
            source="test.work",
            pid=1,
            handled=round(60 + 35 * math.sin(m / 7) + 12 * math.sin(m * 1.3)),
            failed=0,
        )
        for m in range(1, 60)
    )


def screenshot(page, name: str, tmp_path: Path) -> None:
    page.screenshot(path=str(tmp_path / name), full_page=True)
    if os.environ.get("PGMSG_SCREENSHOTS") == "docs":
        shutil.copy(tmp_path / name, ROOT / "docs" / name)


def test_overview_dead_letter_and_replay_with_the_permission(page, dead_letters, tmp_path):
    dead, _ = dead_letters
    seed_history()
    user("admin", superuser=True)
    log_in(page, "admin")
    page.click("text=pgmsg overview")
    expect(page.locator("h1")).to_have_text("pgmsg overview")
    row = page.locator("tr", has=page.locator("td", has_text="test.work"))
    expect(row.locator("td").nth(2)).to_have_text("1")  # backlog: the waiting one
    expect(row.locator("td").nth(4)).to_have_text("1")  # dead letters
    expect(row.locator("svg polyline")).to_have_count(1)
    screenshot(page, "admin-overview.png", tmp_path)

    row.locator("td").nth(4).locator("a").click()
    expect(page.locator("h1")).to_have_text("Dead letters of channel test.work")
    page.click(f"td a[href$='/test.work/{dead.pk}/']")
    payload = page.locator("#payload").inner_text()
    assert '"key": "order-1042"' in payload and '\n  "always_fail": true' in payload
    error = page.locator("#error").inner_text()
    assert error.startswith("Traceback") and "RuntimeError: work order-1042 always fails" in error
    screenshot(page, "admin-deadletter.png", tmp_path)

    page.click("#replay")
    expect(page.locator(".messagelist")).to_contain_text(f"Replayed #{dead.pk}")
    assert not NotificationDeadLetter.objects.filter(pk=dead.pk).exists()
    replayed = Notification.objects.get(pk=dead.pk)  # back, with its id
    assert (replayed.state, replayed.attempts, replayed.payload) == ("pending", 0, dead.payload)


def test_a_user_without_the_permissions_sees_no_action(page, dead_letters, client):
    dead, _ = dead_letters
    viewer = user("viewer", "view_overview", "view_notification")
    log_in(page, "viewer")
    page.goto(f"/admin/pgmsg/overview/dead/channel/test.work/{dead.pk}/")
    expect(page.locator("#payload")).to_contain_text("order-1042")
    expect(page.locator("#replay")).to_have_count(0)
    expect(page.locator("#discard")).to_have_count(0)
    expect(page.locator("#no-actions")).to_be_visible()
    # The server checks too: a hand-made POST is refused with the admin's message and
    # changes nothing.
    client.force_login(viewer)
    url = f"/admin/pgmsg/overview/dead/channel/test.work/{dead.pk}/"
    for action in ("replay", "discard"):
        response = client.post(url, {"action": action, "reason": "x"}, follow=True)
        assert response.redirect_chain == [(url, 302)]
        assert any(f"pgmsg.{action}_notification" in str(m) for m in response.context["messages"])
    dead.refresh_from_db()  # still a dead letter
    assert not Notification.objects.filter(pk=dead.pk).exists()


def test_discard_with_a_reason(page, dead_letters):
    _, inbox_dead = dead_letters
    user("operator", "view_overview", "view_inboxmessage", "discard_inboxmessage")
    log_in(page, "operator")
    page.goto("/admin/pgmsg/overview/")
    row = page.locator("tr", has=page.locator("td", has_text="test.inbox"))
    row.locator("td").nth(4).locator("a").click()
    page.click(f"td a[href$='/test.inbox/{inbox_dead.pk}/']")
    expect(page.locator("#payload")).to_contain_text('"sku": "SKU-1"')
    expect(page.locator("#replay")).to_have_count(0)  # discard only
    page.fill("#reason", "refunded by hand, ticket 5521")
    page.click("#discard")
    expect(page.locator(".messagelist")).to_contain_text(f"Discarded #{inbox_dead.pk}")
    inbox_dead.refresh_from_db()
    assert inbox_dead.status == "discarded"
    assert inbox_dead.discard_reason.startswith("refunded by hand, ticket 5521")
    assert "operator" in inbox_dead.discard_reason
