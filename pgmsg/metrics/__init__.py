"""Operating pgmsg: numbers per channel, inbox and subscription (overview), Prometheus metrics
(collector, exporter for ``listen --metrics-port``, a view for the web process)."""
