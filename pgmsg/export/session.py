"""Spark and Java set-up: the Java check, the master URL check, the SparkSession.

Both checks run before Spark starts (and even when a run has nothing to write), so a broken
set-up fails at once with one line that says what is wrong, instead of after a minute of
Spark retrying, with a Java stack trace.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import pyspark
from pyspark import cloudpickle

from pgmsg.core import errors
from pgmsg.export import files, spark_source

logger = logging.getLogger(__name__)

_LOCAL_RE = re.compile(r"^local(\[(\*|[1-9]\d*)(,\s*[1-9]\d*)?\])?$")
_LOCAL_CLUSTER_RE = re.compile(r"^local-cluster\[\d+,\s*\d+,\s*\d+\]$")
_HOST_PORT_RE = re.compile(r"^(\[[0-9A-Fa-f:]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
MASTER_FORMS = "local[*], local[N], spark://HOST:PORT, yarn or k8s://https://HOST:PORT"
#: Seconds to wait for a standalone master's port before calling it unreachable.
CONNECT_TIMEOUT = 5.0


def java_command() -> str:
    """The java executable Spark will use; JavaMissing says what to install when there is none."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
        raise errors.JavaMissing(
            f"JAVA_HOME is {java_home!r} but {candidate} is not an executable: point JAVA_HOME "
            "at a Java 17 (or later) installation, or unset it to use java from PATH"
        )
    found = shutil.which("java")
    if not found:
        raise errors.JavaMissing(
            "pgmsg_export runs on Spark, which needs Java 17 or later and found no `java` on "
            "PATH: install a JDK or JRE 17+ (e.g. `apt-get install openjdk-17-jre-headless`, "
            "`brew install openjdk@17`) or set JAVA_HOME"
        )
    return found


def spark_home() -> str:
    """SPARK_HOME, or the pyspark package itself (a pip install carries bin/ and jars/)."""
    return os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)


def standalone_addresses(master: str) -> list[tuple[str, int]]:
    """The (host, port) pairs of a ``spark://`` master URL (several for a standby set-up)."""
    addresses = []
    for part in master.removeprefix("spark://").split(","):
        match = _HOST_PORT_RE.match(part.strip())
        if not match or not 0 < int(match.group(2)) < 65536:
            raise errors.ExportError(
                f"export: invalid Spark master {master!r}: a standalone master is "
                "spark://HOST:PORT (the port is usually 7077)"
            )
        addresses.append((match.group(1).strip("[]"), int(match.group(2))))
    return addresses


def check_master(master: str) -> None:
    """Refuse a master URL Spark would not accept, and a standalone master nobody answers at."""
    master = master.strip()
    if _LOCAL_RE.match(master) or _LOCAL_CLUSTER_RE.match(master) or master == "yarn":
        return
    if master.startswith("k8s://") and len(master) > len("k8s://"):
        return
    if not master.startswith("spark://"):
        raise errors.ExportError(
            f"export: invalid Spark master {master!r}: give {MASTER_FORMS} "
            "(--master or PGMSG['EXPORT_SPARK_MASTER'])"
        )
    failures = []
    for host, port in standalone_addresses(master):
        try:
            with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT):
                return
        except OSError as exc:
            failures.append(f"{host}:{port}: {exc.strerror or exc}")
    raise errors.ExportError(
        f"export: no Spark master answers at {master} ({'; '.join(failures)}): start the "
        "master, or give the URL its web UI shows (spark://HOST:PORT)"
    )


def check(master: str) -> None:
    """Everything a run needs before Spark starts: Java, and a master that can be reached."""
    java_command()
    check_master(master)


def start_spark(master: str, spark_conf: dict[str, str] | None = None, *, name: str = "") -> Any:
    """A SparkSession on ``master`` (``local[*]``, ``spark://...``, ``yarn``, ...), with the
    pgmsg data source registered (its code shipped to the executors)."""
    check(master)
    # The Python of Spark's workers is what the driver's PYSPARK_PYTHON says (PySpark takes it
    # from the environment, not from spark.pyspark.python): by default this interpreter, which
    # has pyspark, psycopg and pyarrow; executors elsewhere may give their own.
    spark_conf = spark_conf or {}
    if spark_conf.get("spark.pyspark.python"):
        os.environ["PYSPARK_PYTHON"] = spark_conf["spark.pyspark.python"]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(name or "pgmsg-export").master(master)
    builder = builder.config("spark.ui.showConsoleProgress", str(sys.stderr.isatty()).lower())
    # Spark waits 15 s for a Python worker to connect back; on a loaded machine starting one
    # (pyspark, pyarrow, psycopg imports) took longer and failed the streaming query.
    spark_conf = {"spark.python.authenticate.socketTimeout": "120s", **spark_conf}
    for key, value in spark_conf.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        raise errors.ExportError(
            f"export: Spark did not start on {master!r}: {first_line(exc)}"
        ) from exc
    prepare(spark)
    return spark


def prepare(spark: Any) -> None:
    """Register the data source on a session (the export's own or a caller's)."""
    spark_source.ship(spark)
    # The read tasks' Parquet writer travels by value too (executors have no pgmsg).
    cloudpickle.register_pickle_by_value(files)
    # Parquet's own UTC timestamp type (not the legacy INT96), readable by any Parquet reader.
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")


def stopped(spark: Any) -> bool:
    """Whether the session's SparkContext has stopped (e.g. the master gave up on it)."""
    try:
        return bool(spark.sparkContext._jsc.sc().isStopped())
    except Exception:
        return True


def failure(exc: BaseException, spark: Any = None, master: str = "") -> str:
    """One line saying why a Spark job failed: the pgmsg source's own message when an executor
    raised one, else the first line that names an error."""
    text = str(exc)
    for line in text.splitlines():
        if "pgmsg source:" in line:
            return line[line.index("pgmsg source:") :].strip()[:500]
    if spark is not None and stopped(spark):
        return (
            f"Spark stopped (the master at {master or '?'} did not accept or lost the "
            "application; see Spark's log above): check the master and its workers"
        )
    return first_line(exc)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if "Error" in line or "Exception" in line:
            return line.strip()[:500]
    return (text.splitlines() or [type(exc).__name__])[0][:500]
