"""The lake report: a Spark job over the exported Parquet (never over PostgreSQL) that writes one
self-contained HTML file with tables and matplotlib charts embedded as PNG.

Figures: messages per day and type (events, inbox messages, notifications), the dead-letter
rate per inbox and per channel, inbox processing delay percentiles (``processed_at -
received_at``), and the busiest event streams. Inbox messages are a log of row versions: each
message counts once, in its newest version (highest ``transaction_id``).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import html
import io
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from pgmsg.core import errors
from pgmsg.export import output, session

#: Dataset name -> (timestamp column, type column).
DATASETS = {
    "events": ("recorded_at", "type"),
    "inbox_messages": ("received_at", "type"),
    "notifications": ("created_at", "channel"),
}
PERCENTILES = (0.5, 0.9, 0.99)
BUSIEST = 10


@dataclasses.dataclass
class Report:
    """The figures, as plain values (what the HTML shows)."""

    lake: str
    since: dt.date | None
    #: (dataset, day, type) -> messages.
    per_day: dict[tuple[str, dt.date, str], int]
    #: ("inbox" | "channel", name) -> (dead, total).
    dead_letters: dict[tuple[str, str], tuple[int, int]]
    #: inbox -> (processed, [p50, p90, p99] seconds, max seconds).
    delays: dict[str, tuple[int, list[float], float]]
    #: [(stream, events)], busiest first.
    streams: list[tuple[str, int]]
    datasets: list[str]

    def dead_rate(self, kind: str, name: str) -> float:
        dead, total = self.dead_letters[(kind, name)]
        return dead / total if total else 0.0


def build(lake: str, *, since: dt.date | None = None, spark: Any) -> Report:
    """Compute the report's figures with ``spark`` over the datasets found under ``lake``."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    frames = {}
    for name, (timestamp, _) in DATASETS.items():
        path = output.join(lake, name)
        local = output.local_path(path)
        if local is not None and not (output.parquet_files(path) or {}):
            continue
        frame = spark.read.parquet(path)
        if since is not None:
            start = dt.datetime.combine(since, dt.time(), tzinfo=dt.UTC)
            frame = frame.where(F.col(timestamp) >= F.lit(start))
        frames[name] = frame
    if not frames:
        raise errors.ExportError(
            f"report: no exported dataset under {lake!r} (expected {sorted(DATASETS)}): run "
            "`manage.py pgmsg_export` first"
        )
    if "inbox_messages" in frames:  # one row per message: its newest version
        newest = Window.partitionBy("id").orderBy(F.col("transaction_id").desc())
        frames["inbox_messages"] = (
            frames["inbox_messages"]
            .withColumn("_version", F.row_number().over(newest))
            .where("_version = 1")
            .drop("_version")
        )

    per_day: dict = {}
    for name, frame in frames.items():
        timestamp, type_column = DATASETS[name]
        rows = (
            frame.groupBy(F.to_date(F.col(timestamp)).alias("d"), F.col(type_column).alias("t"))
            .count()
            .collect()
        )
        for row in rows:
            per_day[(name, row["d"], row["t"])] = row["count"]

    dead_letters: dict = {}
    for name, kind, column in (
        ("inbox_messages", "inbox", "inbox"),
        ("notifications", "channel", "channel"),
    ):
        if name in frames:
            rows = (
                frames[name]
                .groupBy(column)
                .agg(
                    F.sum(F.when(F.col("status") == "dead", 1).otherwise(0)).alias("dead"),
                    F.count("*").alias("total"),
                )
                .collect()
            )
            for row in rows:
                dead_letters[(kind, row[column])] = (int(row["dead"]), int(row["total"]))

    delays: dict = {}
    if "inbox_messages" in frames:
        seconds = (F.unix_micros(F.col("processed_at")) - F.unix_micros(F.col("received_at"))) / 1e6
        rows = (
            frames["inbox_messages"]
            .where(F.col("status") == "processed")
            .groupBy("inbox")
            .agg(
                F.count("*").alias("n"),
                F.percentile(seconds, list(PERCENTILES)).alias("p"),
                F.max(seconds).alias("max"),
            )
            .collect()
        )
        for row in rows:
            delays[row["inbox"]] = (row["n"], [float(v) for v in row["p"]], float(row["max"]))

    streams: list = []
    if "events" in frames:
        rows = (
            frames["events"]
            .groupBy("stream_name")
            .count()
            .orderBy(F.col("count").desc(), F.col("stream_name"))
            .limit(BUSIEST)
            .collect()
        )
        streams = [(row["stream_name"], row["count"]) for row in rows]

    return Report(
        lake=lake,
        since=since,
        per_day=per_day,
        dead_letters=dead_letters,
        delays=delays,
        streams=streams,
        datasets=sorted(frames),
    )


def write(
    lake: str,
    destination: str,
    *,
    since: dt.date | None = None,
    spark: Any = None,
    master: str = "local[*]",
    spark_conf: dict[str, str] | None = None,
) -> Report:
    """Build the report and write it as one HTML file at ``destination``."""
    if spark is None:
        spark = session.start_spark(master, spark_conf or {}, name="pgmsg-report")
    report = build(lake, since=since, spark=spark)
    Path(destination).write_text(render(report))
    return report


# -- HTML ---------------------------------------------------------------------------------------


def render(report: Report) -> str:
    """One HTML page, images inlined as data: URLs, no external resource."""
    since = f" since {report.since.isoformat()}" if report.since else ""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>pgmsg lake report: {_e(report.lake)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1000px}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
        "padding:.2em .6em;text-align:right}th:first-child,td:first-child{text-align:left}"
        "</style></head><body>",
        f"<h1>pgmsg lake report</h1><p>{_e(report.lake)}{since}: datasets "
        f"{_e(', '.join(report.datasets))}.</p>",
    ]
    parts += _per_day(report)
    parts += _dead_letters(report)
    parts += _delays(report)
    parts += _streams(report)
    parts.append("</body></html>")
    return "\n".join(parts)


def _per_day(report: Report) -> list[str]:
    totals: dict[tuple[dt.date, str], int] = {}
    for (name, day, type_), count in report.per_day.items():
        totals[(day, f"{name}: {type_}")] = totals.get((day, f"{name}: {type_}"), 0) + count
    days = sorted({day for day, _ in totals})
    kinds = sorted({kind for _, kind in totals})
    rows = [
        [kind] + [str(totals.get((day, kind), 0)) for day in days] + [str(_sum(totals, kind))]
        for kind in kinds
    ]

    def chart(ax):
        bottom = [0] * len(days)
        for kind in kinds:
            values = [totals.get((day, kind), 0) for day in days]
            ax.bar([d.isoformat() for d in days], values, bottom=bottom, label=kind)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_ylabel("messages")
        ax.legend(fontsize="small")

    return [
        "<h2>Messages per day and type</h2>",
        _png(chart) if days else "<p>No messages.</p>",
        _table(["dataset: type", *[d.isoformat() for d in days], "total"], rows),
    ]


def _dead_letters(report: Report) -> list[str]:
    names = sorted(report.dead_letters)
    rows = [
        [f"{kind} {name}", str(dead), str(total), f"{(dead / total if total else 0):.1%}"]
        for (kind, name), (dead, total) in sorted(report.dead_letters.items())
    ]

    def chart(ax):
        ax.barh([f"{k} {n}" for k, n in names], [report.dead_rate(k, n) * 100 for k, n in names])
        ax.set_xlabel("dead letters, % of messages")

    return [
        "<h2>Dead-letter rate</h2>",
        _png(chart) if names else "<p>No inbox messages or notifications.</p>",
        _table(["inbox / channel", "dead", "messages", "rate"], rows),
    ]


def _delays(report: Report) -> list[str]:
    inboxes = sorted(report.delays)
    labels = [f"p{round(p * 100)}" for p in PERCENTILES]
    rows = [
        [inbox, str(n), *[f"{v:.3f}" for v in values], f"{longest:.3f}"]
        for inbox, (n, values, longest) in sorted(report.delays.items())
    ]

    def chart(ax):
        width = 0.8 / len(PERCENTILES)
        for i, label in enumerate(labels):
            ax.bar(
                [x + i * width for x in range(len(inboxes))],
                [report.delays[inbox][1][i] for inbox in inboxes],
                width,
                label=label,
            )
        ax.set_xticks([x + width for x in range(len(inboxes))], inboxes)
        ax.set_ylabel("seconds from receipt to processed")
        ax.legend(fontsize="small")

    return [
        "<h2>Inbox processing delay</h2>",
        _png(chart) if inboxes else "<p>No processed inbox message.</p>",
        _table(["inbox", "processed", *[f"{x} (s)" for x in labels], "max (s)"], rows),
    ]


def _streams(report: Report) -> list[str]:
    def chart(ax):
        ax.barh([s for s, _ in reversed(report.streams)], [n for _, n in reversed(report.streams)])
        ax.set_xlabel("events")

    return [
        f"<h2>Busiest streams (top {BUSIEST})</h2>",
        _png(chart) if report.streams else "<p>No events.</p>",
        _table(["stream", "events"], [[s, str(n)] for s, n in report.streams]),
    ]


def _sum(totals: dict, kind: str) -> int:
    return sum(v for (_, k), v in totals.items() if k == kind)


def _png(draw) -> str:
    # A bare Figure (not pyplot): no display, no global state, the Agg canvas by default.
    figure = Figure(figsize=(9, 3.5))
    draw(figure.add_subplot())
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80)
    encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f"<img alt='chart' src='data:image/png;base64,{encoded}'>"


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _e(value: object) -> str:
    return html.escape(str(value))
