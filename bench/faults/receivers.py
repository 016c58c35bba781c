"""The outside world of bench/faults/run.py: a webhook receiver that counts delivery ids, receivers
that trickle their answer, and a DNS server that never answers."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DELIVERY_HEADER = "X-Ragline-Delivery"


@dataclass
class Receiver:
    """Answers every POST 200 and remembers, per path, when each delivery id arrived."""

    base: str
    arrivals: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"{self.base}/{path}"

    def record(self, path: str, delivery_id: str) -> None:
        with self._lock:
            self.arrivals.setdefault(path.lstrip("/"), []).append((delivery_id, time.time()))

    def first_arrival(self, path: str) -> float | None:
        with self._lock:
            seen = self.arrivals.get(path)
            return seen[0][1] if seen else None

    def delivery_counts(self) -> Counter[str]:
        """How many times each delivery id arrived (a retry of one delivery keeps its id)."""
        with self._lock:
            return Counter(d for seen in self.arrivals.values() for d, _ in seen)

    def paths(self) -> set[str]:
        with self._lock:
            return set(self.arrivals)


@contextmanager
def running_receiver(host: str = "127.0.0.1") -> Iterator[Receiver]:
    holder: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            holder["r"].record(self.path, self.headers.get(DELIVERY_HEADER, ""))
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: object, client_address: object) -> None:
            pass  # a sender that hung up mid-request (its deadline, Redis gone): nothing to print

    server = Server((host, 0), Handler)
    holder["r"] = Receiver(base=f"http://{host}:{server.server_address[1]}")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield holder["r"]
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def running_tricklers(n: int, host: str, byte_every_s: float) -> Iterator[list[str]]:
    """``n`` receivers on ``host``, each a port of its own, that read the request and then send a
    valid 200 one byte every ``byte_every_s``: quick enough for any per-read timeout, slow enough
    to hold a delivery thread for minutes. Yields their URLs."""
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok"
    stop = threading.Event()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = self.request.recv(65536)
                if not chunk:
                    return
                data += chunk
            try:
                for i in range(len(answer)):
                    if stop.wait(byte_every_s):
                        return
                    self.request.sendall(answer[i : i + 1])
            except OSError:
                return

    servers = []
    for _ in range(n):
        server = socketserver.ThreadingTCPServer((host, 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    try:
        yield [f"http://{host}:{s.server_address[1]}/hook" for s in servers]
    finally:
        stop.set()
        for server in servers:
            server.shutdown()
            server.server_close()


@contextmanager
def silent_dns(address: str) -> Iterator[None]:
    """A UDP socket on ``address``:53 that reads every query and answers none: a resolver
    pointed at it waits its whole timeout on every lookup."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, 53))
    sock.settimeout(0.5)
    stop = threading.Event()

    def swallow() -> None:
        while not stop.is_set():
            try:
                sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=swallow, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(2)
        sock.close()
