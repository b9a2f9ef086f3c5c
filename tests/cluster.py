"""A Spark standalone cluster on 127.0.0.1 for the tests: a master and a worker, each its own
JVM started from the PySpark install (``bin/spark-class``), so the executors are other
processes than the driver, as in production.

``MVSINK_TEST_MASTER=standalone`` makes the suite's session run on one (``conftest.spark``);
``make test`` runs the distributed suite that way once.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark

from tests.s3server import free_port, stop

WORKER_CORES = 2
WORKER_MEMORY = "6g"


def _die_with_parent() -> None:
    """In the child: be sent SIGTERM when the test process dies, however it dies (the JVM that
    ``spark-class`` execs keeps the setting)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    spark_class = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
    with open(log, "wb") as out:
        return subprocess.Popen(
            [spark_class, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def _wait_for_line(proc: subprocess.Popen[bytes], log: Path, pattern: str, what: str) -> re.Match[str]:
    deadline = time.monotonic() + 120
    while (found := re.search(pattern, log.read_text(errors="replace"))) is None:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}); see {log}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after 120 s; see {log}")
        time.sleep(0.2)
    return found


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
        # The port it bound (another process may have taken the one asked for: Spark moves on).
        started = _wait_for_line(master, master_log, r"Starting Spark master at (spark://\S+)", "the master")
        url = started.group(1)
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
