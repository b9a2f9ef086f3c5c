"""A fault-injecting S3 endpoint: a reverse proxy on 127.0.0.1 in front of an S3 server.

Run as a subprocess (``python -m tests.chaos.proxy UPSTREAM PORT``): delta-rs holds the GIL
while it waits on HTTP, so a proxy thread in the test's interpreter could never answer it.
Clients reach it through ``AWS_ENDPOINT_URL`` like any S3 endpoint.

Each request has a kind:

* ``GET`` (and ``HEAD``), ``LIST`` (a GET of a bucket listing),
* ``PUT`` (objects, copies and multipart parts), ``CPUT`` (a conditional PUT: ``If-None-Match``
  or ``If-Match``, how delta-rs commits on S3),
* ``DELETE`` (one object, or a batch delete).

and a rule per kind decides its fate, in request order from one seeded generator:

* ``forward``: passed on;
* ``error``: a 503 ``SlowDown`` without forwarding (the request did not happen);
* ``deny``: a 403 ``AccessDenied`` without forwarding (a read-only store);
* ``reset``: the connection reset without forwarding (nor did it);
* ``lost``: forwarded, then the connection reset before the reply (it happened: the client
  does not know);
* ``delay``: held ``delay_s`` seconds, then forwarded (past the client's timeout, it retries).

Rules are set and the counts read over HTTP on the proxy itself, at ``/__faults__``:
``POST`` a JSON ``{"seed": n, "rules": {kind: {"error": p, ..., "delay_s": s, "first": n}}}``
(``p`` a probability; ``first``: at most n requests of that kind are hit, then the kind is
forwarded again; the counts restart), ``GET`` the counts ``{kind: {fate: n}}`` since.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

FATES = ("error", "deny", "reset", "lost", "delay")
CONTROL = "/__faults__"
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "upgrade"}


class Faults:
    """The rules and the counts, shared by the proxy's threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.random = random.Random(0)
        self.rules: dict[str, dict[str, float]] = {}
        self.counts: dict[str, dict[str, int]] = {}

    def configure(self, config: dict[str, Any]) -> None:
        with self.lock:
            self.random = random.Random(int(config.get("seed", 0)))
            self.rules = {k: dict(v) for k, v in config.get("rules", {}).items()}
            self.counts = {}  # new rules, new counts: a test sees only its own

    def fate(self, kind: str) -> tuple[str, float]:
        """What happens to the next request of ``kind``, and the delay if any."""
        with self.lock:
            rule = self.rules.get(kind, {})
            fate = "forward"
            first = rule.get("first")
            if first is None or first > 0:
                draw = self.random.random()
                for name in FATES:
                    p = float(rule.get(name, 0.0))
                    if draw < p:
                        fate = name
                        break
                    draw -= p
                if first is not None and fate != "forward":
                    rule["first"] = first - 1
            counts = self.counts.setdefault(kind, {})
            counts[fate] = counts.get(fate, 0) + 1
            return fate, float(rule.get("delay_s", 0.0))


def kind_of(method: str, path: str, headers: Any) -> str:
    parts = urlsplit(path)
    query = parse_qs(parts.query, keep_blank_values=True)
    if method in ("GET", "HEAD"):
        key = parts.path.strip("/").partition("/")[2]
        return "LIST" if method == "GET" and (not key or "list-type" in query) else "GET"
    if method == "DELETE" or (method == "POST" and "delete" in query):
        return "DELETE"
    if method == "PUT" and (headers.get("If-None-Match") or headers.get("If-Match")):
        return "CPUT"
    return "PUT"


def serve(upstream: str, port: int) -> None:
    target = urlsplit(upstream)
    faults = Faults()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        self.rfile.readline()
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _reset(self) -> None:
            # SO_LINGER 0: close with a TCP reset, as a dropped connection looks to a client.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()

        def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
            self.send_response_only(status)
            length = str(len(body))
            for k, v in headers:
                if k.lower() == "content-length":
                    length = v if self.command == "HEAD" else length  # HEAD: the object's size
                elif k.lower() not in _HOP:
                    self.send_header(k, v)
            self.send_header("Content-Length", length)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _control(self, body: bytes) -> None:
            if self.command == "POST":
                faults.configure(json.loads(body or b"{}"))
            with faults.lock:
                out = json.dumps(faults.counts).encode()
            self._reply(200, [("Content-Type", "application/json")], out)

        def _handle(self) -> None:
            body = self._body()
            if self.path.startswith(CONTROL):
                self._control(body)
                return
            fate, delay = faults.fate(kind_of(self.command, self.path, self.headers))
            if fate == "error":
                slow = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
                self._reply(503, [("Content-Type", "application/xml")], slow)
                return
            if fate == "deny":
                denied = b"<Error><Code>AccessDenied</Code><Message>injected</Message></Error>"
                self._reply(403, [("Content-Type", "application/xml")], denied)
                return
            if fate == "reset":
                self._reset()
                return
            if fate == "delay":
                time.sleep(delay)
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=120)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                headers["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body, headers=headers)
                reply = conn.getresponse()
                data = reply.read()
            finally:
                conn.close()
            if fate == "lost":
                self._reset()
                return
            self._reply(reply.status, reply.getheaders(), data)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
