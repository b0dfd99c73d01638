"""Serving the metrics: prometheus_client's multiprocess mode for ``listen --processes N``, the
HTTP endpoint of ``listen --metrics-port``, and the registry the Django view renders."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from pgmsg.core import errors, instruments
from pgmsg.metrics import collector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: What to install: pgmsg itself is not on PyPI (README), so not pgmsg with the extra.
INSTALL = "pip install prometheus_client (or the checkout with its extra: './pgmsg[metrics]')"


def require() -> None:
    if not instruments.enabled():
        raise errors.ConfigurationError(f"metrics need prometheus_client: {INSTALL}")


def use_multiprocess_dir() -> str | None:
    """Make every process of this run write its counters to one directory (the parent's
    PROMETHEUS_MULTIPROC_DIR, or a new temporary one). Returns the directory if it was created
    here (the caller removes it at the end). Must run before the first instrument is made."""
    require()
    from prometheus_client import values

    created = None
    if not os.environ.get(MULTIPROC_ENV):
        created = tempfile.mkdtemp(prefix="pgmsg-metrics-")
        os.environ[MULTIPROC_ENV] = created
    # prometheus_client chooses how values are stored when it is first imported (Django's
    # start-up may have imported it already): choose again now that the directory is set.
    values.ValueClass = values.get_value_class()
    return created


def remove_multiprocess_dir(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


class _ProcessCollector:
    """This process's own instruments (no multiprocess directory: one process, e.g. runserver)."""

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client import REGISTRY

        yield from REGISTRY.collect()


def registry() -> Any:
    """The metrics to expose: the workers' counters (all processes that share
    PROMETHEUS_MULTIPROC_DIR, or this process's own) and the database's gauges."""
    require()
    from prometheus_client import CollectorRegistry, multiprocess

    result = CollectorRegistry(auto_describe=False)
    if os.environ.get(MULTIPROC_ENV):
        multiprocess.MultiProcessCollector(result)
    else:
        result.register(_ProcessCollector())
    result.register(collector.DatabaseCollector())
    return result


def serve(port: int, address: str) -> Any:
    """Serve the metrics over HTTP from a daemon thread of this process; returns the server."""
    from prometheus_client import start_http_server

    return start_http_server(port, addr=address, registry=registry())
