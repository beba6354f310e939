"""Storage that stutters, for tests and benchmarks: an HTTP proxy in front of a GCS endpoint
(the emulator of `cairn.storage.testing`) that injects the faults a bucket shows on a pod.

    with GcsEmulator() as emu, FaultProxy(emu.url, rate=0.05, seed=0) as proxy:
        env = proxy.environ()        # child processes reach the bucket through the proxy
        proxy.activate()             # ... and so does this one
        ...
        proxy.outage(30.0)           # every request answered 503 for the next 30 s
        proxy.outage(60.0, after=r"checkpoints/8")  # ... from the first request naming that
        print(proxy.counts())        # {"requests": ..., "429": ..., "503": ..., "reset": ..., "delay": ...}

Each request draws once from a seeded RNG (in the order the proxy receives requests): with
probability `rate` it gets one fault, chosen uniformly among `kinds`:

- `"429"` and `"503"`: answered with that status (and a JSON error body) without reaching the
  emulator, as GCS does when it sheds load;
- `"reset"`: the connection is reset mid-body. A GET is forwarded and half of its answer's body
  sent before the reset (TCP RST); any other request (an upload, a delete) is read whole and the
  connection reset before it is forwarded (the emulator never sees it), so a fault never
  applies a write the client then believes failed;
- `"delay"`: forwarded after `delay_s` seconds.

`outage(seconds)` answers every request with 503 until that time has passed, from now or from
the first request matching a pattern (`end_outage()` ends it at once); the requests it refuses
are counted under `"outage"`. Faults are reproducible
for a sequence of requests; requests from several threads arrive in no fixed order, so which
request of a run faults is not. The proxy is threaded (a thread per connection, keep-alive).
"""

from __future__ import annotations

import http.client
import http.server
import json
import random
import re
import socket
import socketserver
import struct
import threading
import time
import urllib.parse
from collections import Counter

from cairn.storage.testing import Endpoint

FAULT_KINDS = ("429", "503", "reset", "delay")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address) -> None:  # a client gone mid-answer: not news
        pass


class FaultProxy(Endpoint):
    """A fault-injecting HTTP proxy to `upstream` on a free port of 127.0.0.1 (`url`);
    `environ()` and `activate()` point processes at it (as `GcsEmulator`'s do at the emulator)."""

    def __init__(
        self,
        upstream: str,
        rate: float = 0.0,
        seed: int = 0,
        kinds: tuple[str, ...] = FAULT_KINDS,
        delay_s: float = 1.0,
    ):
        unknown = sorted(set(kinds) - set(FAULT_KINDS))
        if unknown or not kinds:
            raise ValueError(f"FaultProxy: fault kinds {unknown or '()'}; allowed: {', '.join(FAULT_KINDS)}")
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"FaultProxy: rate must be in [0, 1], got {rate}")
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream = upstream.rstrip("/")
        self._upstream_host, self._upstream_port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.rate, self.kinds, self.delay_s = float(rate), tuple(kinds), float(delay_s)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._outage_until = 0.0
        self._armed: tuple[re.Pattern, float] | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # -- control ---------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.deactivate()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def set_rate(self, rate: float) -> None:
        """Changes the fraction of requests that fault (0: a clean proxy)."""
        with self._lock:
            self.rate = float(rate)

    def outage(self, seconds: float, after: str | None = None) -> None:
        """Every request is answered 503 for the next `seconds`; with `after` (a regular
        expression), from the first request whose method and URL (unquoted, e.g.
        `POST /upload/storage/v1/b/bucket/o?name=run/checkpoints/8/...`) match it, that one
        included."""
        with self._lock:
            if after is None:
                self._outage_until, self._armed = time.monotonic() + float(seconds), None
            else:
                self._armed = (re.compile(after), float(seconds))

    def end_outage(self) -> None:
        """Ends an outage (and one armed by `outage(after=...)`) now."""
        with self._lock:
            self._outage_until, self._armed = 0.0, None

    def counts(self) -> dict[str, int]:
        """Requests received, and how many got each fault (`"outage"`: refused by an outage)."""
        with self._lock:
            return {"requests": 0, **{k: 0 for k in self.kinds}, "outage": 0, **self._counts}

    # -- one request -----------------------------------------------------------------------
    def _draw(self, method: str, target: str) -> str | None:
        with self._lock:
            self._counts["requests"] += 1
            if self._armed is not None and self._armed[0].search(f"{method} {urllib.parse.unquote(target)}"):
                self._outage_until, self._armed = time.monotonic() + self._armed[1], None
            if time.monotonic() < self._outage_until:
                self._counts["outage"] += 1
                return "outage"
            hit = self._rng.random() < self.rate
            kind = self._rng.choice(self.kinds) if hit else None
            if kind is not None:
                self._counts[kind] += 1
            return kind

    def _forward(self, method: str, target: str, headers: dict, body: bytes) -> tuple[int, list, bytes]:
        conn = http.client.HTTPConnection(self._upstream_host, self._upstream_port, timeout=300)
        try:
            conn.request(method, target, body=body, headers=headers)
            r = conn.getresponse()
            data = r.read()
            out = []
            for k, v in r.getheaders():
                if k.lower() in _HOP_BY_HOP or k.lower() == "content-length":
                    continue
                if k.lower() == "location":
                    v = v.replace(self.upstream, self.url)
                out.append((k, v))
            return r.status, out, data
        finally:
            conn.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: FaultProxy

    def log_message(self, *args) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline().strip():  # trailers
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _reset(self) -> None:
        """Closes the connection with a TCP RST (SO_LINGER 0), as a dropped connection does."""
        try:
            self.wfile.flush()
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close_connection = True
        self.connection.close()

    def _send(self, status: int, headers: list, body: bytes, cut: bool = False) -> None:
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if cut:
            self.wfile.write(body[: len(body) // 2])
            self._reset()
            return
        self.wfile.write(body)

    def _handle(self) -> None:
        body = self._body()
        fault = self.owner._draw(self.command, self.path)
        if fault in ("429", "503", "outage"):
            code = 429 if fault == "429" else 503
            message = "rate limited (injected)" if code == 429 else "service unavailable (injected)"
            error = json.dumps({"error": {"code": code, "message": message}}).encode()
            self._send(code, [("Content-Type", "application/json")], error)
            return
        if fault == "reset" and self.command != "GET":
            self._reset()  # dropped before it reached the store: nothing applied
            return
        if fault == "delay":
            time.sleep(self.owner.delay_s)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers.pop("Content-Length", None)
        if body or self.command in ("POST", "PUT", "PATCH"):
            headers["Content-Length"] = str(len(body))
        try:
            status, out, data = self.owner._forward(self.command, self.path, headers, body)
        except OSError as e:
            self._send(502, [("Content-Type", "text/plain")], f"proxy: upstream failed: {e}".encode())
            return
        if fault == "reset" and not data:
            self._reset()  # nothing to cut: dropped before the answer
            return
        self._send(status, out, data, cut=fault == "reset")

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle
