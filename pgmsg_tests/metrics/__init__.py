"""Tests of pgmsg/metrics/ (the overview, the Prometheus collector and exporter)."""
