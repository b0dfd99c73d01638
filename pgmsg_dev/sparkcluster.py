"""A Spark standalone cluster on 127.0.0.1 for tests and benches: a Master and Workers of 1 core
each, started from the pyspark package itself (its bin/spark-class), nothing downloaded."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from pgmsg.export import session


class Cluster:
    """A Spark standalone cluster on 127.0.0.1: one Master, two Workers of 1 core each."""

    def __init__(self, root: Path, workers: int = 2) -> None:
        self.workers = workers
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.home = Path(session.spark_home())
        self.procs: list[subprocess.Popen] = []
        self.url = ""
        self.work_dirs = [root / f"worker{i}" for i in range(self.workers)]
        # The executors' Python: this interpreter without `site`, so without pgmsg (installed
        # editable through a .pth file) and without the project: what they need (pyspark,
        # psycopg, pyarrow) comes from site-packages on PYTHONPATH, the pgmsg data source is
        # shipped by the driver.
        self.python = root / "executor-python"
        packages = sysconfig.get_paths()["purelib"]
        self.python_calls = root / "executor-python.calls"
        self.python.write_text(
            "#!/bin/sh\n"
            f'echo "$PWD" >> {self.python_calls}\n'
            f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{packages}" exec {sys.executable} -S "$@"\n'
        )
        self.python.chmod(0o755)

    def env(self) -> dict:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DJANGO", "DATABASE", "PYSPARK", "PYTHON", "SPARK"))
        }
        env.update(
            SPARK_HOME=str(self.home),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_DAEMON_MEMORY="256m",
            SPARK_CONF_DIR=str(self.root),  # none of the machine's own Spark settings
            SPARK_LOG_DIR=str(self.root),
        )
        return env

    def _start(self, name: str, *args: str) -> subprocess.Popen:
        with open(self.root / f"{name}.log", "w") as log:
            proc = subprocess.Popen(
                [str(self.home / "bin" / "spark-class"), *args],
                env=self.env(),
                cwd=self.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text()

    def _wait(self, what: str, found, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = found()
            if value:
                return value
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.2)
        logs = "\n".join(p.read_text()[-2000:] for p in self.root.glob("*.log"))
        raise RuntimeError(f"the test Spark cluster did not come up ({what}):\n{logs}")

    def start(self) -> None:
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
        )  # fmt: skip
        self.url = self._wait(
            "master URL",
            lambda: (
                (m := re.search(r"Starting Spark master at (spark://\S+)", self.log("master")))
                and m.group(1)
            ),
        )
        for i, work_dir in enumerate(self.work_dirs):
            work_dir.mkdir()
            self._start(
                f"worker{i}",
                "org.apache.spark.deploy.worker.Worker",
                "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                "--work-dir", str(work_dir), "--webui-port", "0", self.url,
            )  # fmt: skip
        for i in range(self.workers):
            self._wait(
                f"worker {i} registered",
                lambda i=i: "Successfully registered with master" in self.log(f"worker{i}"),
            )

    def conf(self) -> list[str]:
        """--conf options for an application on this cluster: small memory, 127.0.0.1 only."""
        settings = {
            "spark.pyspark.python": str(self.python),
            "spark.executor.memory": "512m",
            "spark.driver.memory": "512m",
            "spark.executor.cores": "1",
            "spark.cores.max": str(self.workers),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            # Schedule only once both executors are there, so both get read partitions.
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.sql.shuffle.partitions": "2",
        }
        return [arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}")]

    def executor_logs(self, application: str) -> list[str]:
        """Each worker's executor stderr for ``application``, worker by worker."""
        return [
            "".join(p.read_text() for p in (work_dir / application).glob("*/stderr"))
            for work_dir in self.work_dirs
        ]

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
