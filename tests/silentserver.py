"""A TCP server that accepts connections, reads each request and never answers: an S3 endpoint
that hangs (a store behind a stuck proxy, an overloaded gateway).

A subprocess, like the moto server (``s3server.py``): delta-rs holds the GIL while it waits on
HTTP. It prints one line per request head it reads, so a test sees how many requests were in
flight at once (none is ever answered).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.s3server import free_port, stop, wait_for_port

_SERVER = """
import socket, sys, threading
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen(256)
held = []  # every connection stays open, unanswered
lock = threading.Lock()  # one whole line at a time

def serve(conn):
    held.append(conn)
    data = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
        while b"\\r\\n\\r\\n" in data:
            head, _, data = data.partition(b"\\r\\n\\r\\n")
            with lock:
                sys.stdout.write(head.split(b"\\r\\n", 1)[0].decode(errors="replace") + "\\n")
                sys.stdout.flush()

while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


class SilentServer:
    """A running silent server: the storage options that reach it, and what it was sent."""

    def __init__(self, options: dict[str, str], log: Path) -> None:
        self.options = options
        self.log = log

    def requests(self) -> list[str]:
        """The request lines read so far (``POST /bucket?delete HTTP/1.1`` ...)."""
        return [line for line in self.log.read_text().splitlines() if " HTTP/" in line]

    def wait_for_requests(self, count: int, seconds: float = 20.0) -> int:
        """How many requests arrived, once ``count`` did or ``seconds`` passed."""
        deadline = time.monotonic() + seconds
        while len(self.requests()) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(self.requests())


@contextlib.contextmanager
def silent_server(log: Path) -> Iterator[SilentServer]:
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        wait_for_port(proc, port, "silent server", log)
        yield SilentServer(
            {
                "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_REGION": "us-east-1",
                "AWS_ALLOW_HTTP": "true",
            },
            log,
        )
    finally:
        stop(proc)
