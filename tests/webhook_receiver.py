"""A real local HTTP receiver for webhook tests: scripted status codes per path, every request kept."""

from __future__ import annotations

import socketserver
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

DOCS = Path(__file__).resolve().parents[1] / "docs" / "webhooks.md"


def documented_verify() -> Callable[[str, httpx.Headers, bytes], bool]:
    """The receiver's ``verify`` exactly as docs/webhooks.md prints it (its first Python block)."""
    code = DOCS.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(compile(code, str(DOCS), "exec"), namespace)
    return namespace["verify"]  # type: ignore[return-value]


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes
    at: float


@dataclass
class Receiver:
    base: str
    requests: list[Received] = field(default_factory=list)
    _plans: dict[str, list[int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, *statuses: int) -> str:
        """A fresh path that answers ``statuses`` in turn, then 200 for ever."""
        path = f"/hook/{uuid.uuid4().hex}"
        self._plans[path] = list(statuses)
        return self.base + path

    def _answer(self, path: str) -> int:
        with self._lock:
            plan = self._plans.get(path)
            return plan.pop(0) if plan else 200

    def received(self, url: str) -> list[Received]:
        path = url.removeprefix(self.base)
        with self._lock:
            return [r for r in self.requests if r.path == path]

    def wait(self, url: str, count: int, timeout: float) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.received(url)
            if len(got) >= count:
                return got
            time.sleep(0.05)
        return self.received(url)


@contextmanager
def running_receiver() -> Iterator[Receiver]:
    holder: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            receiver = holder["r"]
            with receiver._lock:
                receiver.requests.append(
                    Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.time())
                )
            status = receiver._answer(self.path)
            self.send_response(status)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:  # quiet test output
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder["r"] = Receiver(base=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder["r"]
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Trickler:
    """A hostile receiver: it reads the request, then answers a valid 200 one byte at a time."""

    base: str
    connections: int = 0
    completed: int = 0  # answers sent to the end
    cut_off: int = 0  # the client hung up mid-answer
    stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, what: str) -> None:
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)

    def wait(self, what: str, n: int, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while getattr(self, what) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return int(getattr(self, what))


@contextmanager
def running_trickler(byte_every_s: float) -> Iterator[Trickler]:
    """Each read the client makes gets a byte quickly enough for any per-read timeout; the whole
    answer takes ``byte_every_s`` times its length."""
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok"
    holder: dict[str, Trickler] = {}

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            trickler = holder["t"]
            trickler.count("connections")
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = self.request.recv(65536)
                if not chunk:
                    return
                data += chunk
            try:
                for i in range(len(answer)):
                    if trickler.stop.wait(byte_every_s):
                        return
                    self.request.sendall(answer[i : i + 1])
            except OSError:
                trickler.count("cut_off")
                return
            trickler.count("completed")

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    holder["t"] = Trickler(base=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder["t"]
    finally:
        holder["t"].stop.set()
        server.shutdown()
        server.server_close()
