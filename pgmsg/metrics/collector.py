"""The Prometheus gauges read from the database at scrape time: backlog, oldest pending age,
dead letters and subscription lag per channel, inbox and subscription."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import connections

from pgmsg.core import conf
from pgmsg.metrics import overview


class DatabaseCollector:
    """A prometheus_client collector: one set of queries per scrape (see overview.sql)."""

    def describe(self) -> list:
        return []  # read the database only when scraped, never at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        labels = ["kind", "source"]
        families = {
            "backlog": GaugeMetricFamily(
                "pgmsg_backlog",
                "Messages waiting per source (a subscription: events after its lowest checkpoint)",
                labels=labels,
            ),
            "oldest_pending_age": GaugeMetricFamily(
                "pgmsg_oldest_pending_age_seconds",
                "Seconds since the oldest waiting message of a source arrived",
                labels=labels,
            ),
            "dead": GaugeMetricFamily(
                "pgmsg_dead_letters",
                "Dead letters per source (a subscription: stopped partitions)",
                labels=labels,
            ),
        }
        lag_events = GaugeMetricFamily(
            "pgmsg_subscription_lag_events",
            "Events of the subscription's category after its lowest checkpoint",
            labels=["subscription"],
        )
        lag_seconds = GaugeMetricFamily(
            "pgmsg_subscription_lag_seconds",
            "Seconds since the oldest event the subscription has not read was recorded",
            labels=["subscription"],
        )
        try:
            rows = overview.overview(with_throughput=False)
        finally:
            # Scrapes run in the exporter's thread: do not keep a connection per thread.
            connections[conf.get().DATABASE].close()
        for row in rows:
            for field, family in families.items():
                family.add_metric([row.kind, row.name], getattr(row, field))
            if row.kind == "subscription":
                lag_events.add_metric([row.name], row.backlog)
                lag_seconds.add_metric([row.name], row.oldest_pending_age)
        yield from families.values()
        yield lag_events
        yield lag_seconds
