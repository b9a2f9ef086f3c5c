"""A moto S3 server in a subprocess, for the tests and the benchmarks.

A subprocess, not a thread: delta-rs keeps the GIL while it waits on HTTP, so a server thread
in the same interpreter could never answer it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BUCKET = "mvsink-tests"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(proc: subprocess.Popen[bytes], port: int, what: str, log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}); see {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not up after 120 s; see {log}") from None
            time.sleep(0.2)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def serving(command: list[str], port: int, what: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run the server ``command`` in a process group of its own, its output to ``log``, until
    it listens on ``port``; stop it (the whole group) when the block ends."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    try:
        wait_for_port(proc, port, what, log)
        yield proc
    finally:
        stop(proc)


@contextlib.contextmanager
def moto_server(log: Path) -> Iterator[dict[str, str]]:
    """Start a moto S3 server with bucket ``BUCKET``; yield the storage options reaching it."""
    port = free_port()
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with serving(command, port, "moto S3 server", log):
        options = {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }
        import boto3

        boto3.client(
            "s3",
            endpoint_url=options["AWS_ENDPOINT_URL"],
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket=BUCKET)
        yield options


class FaultyS3:
    """A running fault proxy (``tests/chaos/proxy.py``): the storage options that reach the
    S3 server through it, and its controls."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.control = options["AWS_ENDPOINT_URL"] + "/__faults__"

    def set(self, rules: dict[str, dict[str, float]], seed: int = 0) -> None:
        """Replace the rules (and restart the counts' generator at ``seed``)."""
        self._call("POST", json.dumps({"seed": seed, "rules": rules}).encode())

    def counts(self) -> dict[str, dict[str, int]]:
        """Requests seen so far, by kind and fate (``forward`` or the fault)."""
        return dict(self._call("GET", None))

    def injected(self, kind: str, fate: str) -> int:
        return self.counts().get(kind, {}).get(fate, 0)

    def _call(self, method: str, body: bytes | None) -> Any:
        request = urllib.request.Request(self.control, data=body, method=method)
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.loads(reply.read())


@contextlib.contextmanager
def fault_proxy(upstream: dict[str, str], log: Path) -> Iterator[FaultyS3]:
    """Start the fault proxy in front of the S3 server ``upstream`` reaches."""
    port = free_port()
    root = Path(__file__).resolve().parent.parent
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.proxy", upstream["AWS_ENDPOINT_URL"], str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=root,
        )
    try:
        wait_for_port(proc, port, "fault proxy", log)
        yield FaultyS3({**upstream, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"})
    finally:
        stop(proc)
