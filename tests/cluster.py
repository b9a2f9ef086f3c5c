"""A Spark standalone cluster on 127.0.0.1 for the tests: a master and a worker, each its own
JVM started from the PySpark install (``bin/spark-class``), so the executors are other
processes than the driver, as in production.

``MVSINK_TEST_MASTER=standalone`` makes the suite's session run on one (``conftest.spark``);
``make test`` runs the distributed suite that way once.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark

from tests.s3server import free_port, stop, wait_for_port

WORKER_CORES = 2
WORKER_MEMORY = "6g"


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    spark_class = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
    with open(log, "wb") as out:
        return subprocess.Popen(
            [spark_class, *args], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _wait_for_line(proc: subprocess.Popen[bytes], log: Path, text: str, what: str) -> None:
    deadline = time.monotonic() + 120
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}); see {log}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after 120 s; see {log}")
        time.sleep(0.2)


@contextlib.contextmanager
def standalone_cluster(folder: Path) -> Iterator[str]:
    """Start a master and a worker (``WORKER_CORES`` cores) logging into ``folder``; yield the
    master's URL. The worker, and so its executors, inherit this process's environment (the
    suite's S3 server) and run this interpreter for Python."""
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_WORKER_DIR": str(folder / "work"),
        "PYSPARK_PYTHON": sys.executable,
    }
    port = free_port()
    master_log, worker_log = folder / "master.log", folder / "worker.log"
    args = ["--host", "127.0.0.1", "--port", str(port), "--webui-port", "0"]
    master = _start(["org.apache.spark.deploy.master.Master", *args], master_log, env)
    worker = None
    try:
        wait_for_port(master, port, "the Spark master", master_log)
        url = f"spark://127.0.0.1:{port}"
        worker = _start(
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--webui-port",
                "0",
                "--cores",
                str(WORKER_CORES),
                "--memory",
                WORKER_MEMORY,
                url,
            ],
            worker_log,
            env,
        )
        _wait_for_line(worker, worker_log, "Successfully registered with master", "the Spark worker")
        yield url
    finally:
        if worker is not None:
            stop(worker)
        stop(master)
