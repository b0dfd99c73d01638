"""``manage.py demo --live``, lightly: the helper the flag runs starts uvicorn on the example
shop, says the page's URL, and the page's feed streams the "order" category."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from unittest import mock

import pytest
from django.db import connection

import pgmsg
from pgmsg_dev.devdb import database_url
from pgmsg_tests.conftest import ROOT, skip_unless
from pgmsg_tests.live.conftest import free_port, uvicorn
from pgmsg_tests.live.sse import SseClient

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


class Placed(pgmsg.Event, type="test.live_order_placed"):
    customer: str
    total: str


def test_the_demo_has_a_live_flag():
    out = subprocess.run(
        [sys.executable, "manage.py", "demo", "--help"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "example_project.settings"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--live" in out and "--live-port" in out


def test_the_live_flag_serves_the_order_feed_page():
    skip_unless(uvicorn is not None, "uvicorn is not installed (pip install -e .[dev])")
    from example_project.shop.live import start_live_page

    port = free_port()
    said: list[str] = []
    env = {
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DATABASE_URL": database_url(connection.settings_dict),
    }
    with mock.patch.dict(os.environ, env):
        server, url = start_live_page(said.append, port=port)
    try:
        assert url == f"http://127.0.0.1:{port}/live/" and url in said[0]
        page = urllib.request.urlopen(url, timeout=30).read().decode()
        assert 'new EventSource("orders")' in page
        feed = SseClient(port, "/live/orders")
        try:
            assert feed.status == 200
            pgmsg.append("order-1", Placed(customer="ada", total="9.90"))
            event = feed.events(1)[0]
            assert event["stream"] == "order-1" and event["data"]["customer"] == "ada"
        finally:
            feed.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
