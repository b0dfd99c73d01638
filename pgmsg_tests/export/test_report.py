"""The lake report: a Spark job over the exported Parquet; its figures equal counts computed
with pyarrow from the same files, and its HTML embeds every chart."""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from django.core.management import CommandError, call_command

import pgmsg
from pgmsg.events import store
from pgmsg.export import report, run
from pgmsg.models import Notification
from pgmsg_tests.export.helpers import latest_versions, read_dataset, settle
from pgmsg_tests.helpers import make_dead
from pgmsg_tests.inbox.helpers import drain, make_due_now
from pgmsg_tests.testapp.channels import Unheard

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.spark]


class Shipped(store.Event, type="report.shipped"):
    n: int


class Billed(store.Event, type="report.billed"):
    n: int


def build_lake(spark, lake) -> None:
    for i, stream in enumerate(["order-1", "order-2", "order-2", "invoice-9", "order-2"]):
        store.append(stream, [Shipped(n=i), Billed(n=i)] if i % 2 else Shipped(n=i))
    pgmsg.receive_many(
        "test.inbox",
        [{"message_id": f"r{i}", "type": "work", "payload": {}} for i in range(6)]
        + [{"message_id": "dead1", "type": "urgent", "payload": {"fail_times": 9}}],
    )
    for _ in range(3):  # max_attempts=3: "dead1" becomes a dead letter
        drain("test.inbox")
        make_due_now()
    pgmsg.notify_many(Unheard(key=f"n{i}") for i in range(4))
    dying = Notification.objects.filter(payload__key__in=["n0", "n1", "n2"])
    make_dead(dying.values_list("pk", flat=True))
    settle("pgmsg_event")
    settle("pgmsg_inbox_message")
    run.export_tables(str(lake), spark=spark)


def test_the_report_figures_equal_pyarrow_counts_of_the_lake(spark, tmp_path):
    lake = tmp_path / "lake"
    build_lake(spark, lake)
    events = read_dataset(lake / "events")
    inbox = latest_versions(read_dataset(lake / "inbox_messages"), "id")
    notifications = read_dataset(lake / "notifications")

    call_command("pgmsg_report", "--lake", str(lake), "--output", str(tmp_path / "report.html"))
    figures = report.build(str(lake), spark=spark)

    expected = Counter()
    for name, rows, ts, kind in (
        ("events", events, "recorded_at", "type"),
        ("inbox_messages", inbox, "received_at", "type"),
        ("notifications", notifications, "created_at", "channel"),
    ):
        for row in rows:
            expected[(name, row[ts].astimezone(dt.UTC).date(), row[kind])] += 1
    assert figures.per_day == dict(expected)
    assert sum(figures.per_day.values()) == 7 + 7 + 4

    assert figures.dead_letters == {
        ("inbox", "test.inbox"): (1, 7),
        ("channel", "test.unheard"): (3, 4),
    }
    processed = [r for r in inbox if r["status"] == "processed"]
    delays = pa.array([(r["processed_at"] - r["received_at"]).total_seconds() for r in processed])
    [(count, percentiles, longest)] = figures.delays.values()
    assert count == 6
    want = pc.quantile(delays, q=list(report.PERCENTILES), interpolation="linear").to_pylist()
    assert percentiles == pytest.approx(want, abs=1e-6)
    assert longest == pytest.approx(pc.max(delays).as_py(), abs=1e-6)

    by_stream = Counter(r["stream_name"] for r in events)
    assert figures.streams == sorted(by_stream.items(), key=lambda s: (-s[1], s[0]))
    assert figures.streams[0] == ("order-2", 4)

    page = (tmp_path / "report.html").read_text()
    assert len(re.findall(r"src='data:image/png;base64,[A-Za-z0-9+/=]+'", page)) == 4
    assert not re.search(r"(src|href)=['\"]?(https?:|//)", page)  # self-contained
    assert "<td>inbox test.inbox</td><td>1</td><td>7</td><td>14.3%</td>" in page
    assert "<td>order-2</td><td>4</td>" in page

    tomorrow = dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1)
    assert report.build(str(lake), since=tomorrow, spark=spark).per_day == {}


def test_a_lake_without_datasets_is_a_clear_command_error(spark, tmp_path):
    with pytest.raises(CommandError, match="no exported dataset under"):
        call_command("pgmsg_report", "--lake", str(tmp_path), "--output", str(tmp_path / "r"))
