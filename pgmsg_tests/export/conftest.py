"""Spark for the export tests: one local session, and a real standalone cluster (a Master and two
Workers started from the pyspark package itself), each started once per test session."""

from __future__ import annotations

import os
import sys

import pytest

from pgmsg.core import errors
from pgmsg.export import session as spark_setup
from pgmsg_dev import sparkcluster
from pgmsg_tests.conftest import skip_unless

# Spark binds to the address the host name resolves to, else to the first interface's: these
# tests (and the export processes they start, which inherit it) stay on 127.0.0.1.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def needs_java() -> None:
    """Skip, saying what is missing, where Spark cannot run (CI turns skips into failures)."""
    try:
        spark_setup.java_command()
    except errors.JavaMissing as exc:
        skip_unless(False, f"the Spark export tests need Java 17+: {exc}")


@pytest.fixture(scope="session")
def spark():
    """One local Spark for the whole session: starting it costs seconds, reusing it nothing."""
    needs_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("pgmsg-export-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "768m")
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    needs_java()
    cluster = sparkcluster.Cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
