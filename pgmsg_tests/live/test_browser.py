"""A real browser's EventSource on the live endpoint (Playwright driving Debian's Chromium,
uvicorn serving): it receives events appended by this process, keeps receiving across a
server restart (SIGKILL), and resumes by its Last-Event-ID with nothing missed or twice."""

from __future__ import annotations

import os
import shutil

import pytest
from django.db import connections

from pgmsg_tests.conftest import skip_unless, wait_for
from pgmsg_tests.live.test_live import append

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def browser():
    skip_unless(sync_playwright is not None, "playwright is not installed (pip install -e .[dev])")
    skip_unless(
        CHROMIUM is not None,
        "Debian's Chromium is not installed: apt-get install chromium (.ci/run installs it)",
    )
    # Playwright's sync API runs an event loop in this thread; the appends are plain ORM calls.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        yield launched
        launched.close()
    del os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"]


def test_an_event_source_follows_the_store_across_a_server_restart(browser, live_server_factory):
    live = live_server_factory(settings={"LIVE_RETRY": 0.2})
    page = browser.new_page()
    try:
        page.goto(f"http://127.0.0.1:{live.port}/live/page?category=livebrowser")
        wait_for(lambda: page.evaluate("window.opens") == 1, message="the EventSource open")

        def numbers() -> list[int]:
            return [n for _id, n in page.evaluate("window.received")]

        append("livebrowser-1", 1, 2)
        wait_for(lambda: numbers() == [1, 2], message="events 1 and 2 in the page")
        live.kill()
        wait_for(lambda: page.evaluate("window.errors") >= 1, message="the browser seeing it")
        append("livebrowser-1", 3, 4)  # while the server is down
        live.start()
        wait_for(lambda: page.evaluate("window.opens") == 2, message="the EventSource back")
        append("livebrowser-2", 5)
        wait_for(lambda: len(numbers()) >= 5, message="events 3 to 5 in the page")
        received = page.evaluate("window.received")
        assert [n for _id, n in received] == [1, 2, 3, 4, 5]  # nothing missed, nothing twice
        ids = [event_id for event_id, _n in received]
        assert ids == sorted(ids) and len(set(ids)) == 5
        assert page.locator("#received li").count() == 5
    finally:
        page.close()
        # The appends ran while Playwright's event loop was running in this thread, so they got
        # a connection of that context (asgiref's Local): close it, or the test database
        # cannot be dropped at the end of the run.
        connections.close_all()
