"""The open-loop generator sends on schedule, records every answer, and never waits for the server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.openloop import _weighted, open_loop, percentile


class _Server(ThreadingHTTPServer):
    """Holds every slow answer until all ``expected`` requests have arrived: a generator that
    waited for an answer before sending on would never send the rest, and its slow requests
    would time out. Causality, not a stopwatch, shows that nothing waited on the server."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], expected: int) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.expected = expected
        self.arrived = 0
        self.all_arrived = threading.Event()
        self._lock = threading.Lock()

    def arrive(self) -> None:
        with self._lock:
            self.arrived += 1
            if self.arrived >= self.expected:
                self.all_arrived.set()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the generator reuses its connections
    server: _Server

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.arrive()
        i = body["i"]
        if i % 4 == 3:
            self.server.all_arrived.wait(timeout=30)  # slow: answered once the last one is in
        status = 429 if i % 5 == 4 else 200
        payload = json.dumps({"degraded": i % 2 == 1}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = _Server(_Handler, expected=40)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1/query"
    httpd.shutdown()


def test_open_loop_keeps_its_schedule_and_records_outcomes(server: str) -> None:
    samples = open_loop(
        server,
        rate=40,
        duration_s=1.0,
        body=lambda i: {"i": i, "allow_degraded": i % 2 == 0},
        headers=[{"x-k": "a"}, {"x-k": "b"}],
        shares=[0.75, 0.25],
        timeout_s=5,
    )
    assert len(samples) == 40
    # No timeout: the slow answers came once the last request was in, so none was waited on.
    outcomes = {s.outcome for s in samples}
    assert outcomes == {"full", "degraded", "429"}
    # On schedule, never ahead of it (asyncio's timers may fire a clock tick early): the last one
    # left no sooner than 39/40 s in.
    assert min(s.lag for s in samples) > -1e-3 and samples[-1].sent > 39 / 40 - 1e-3
    assert sum(1 for s in samples if s.key == 0) == 30


def test_weighted_keys_and_percentiles() -> None:
    assert _weighted([0.4, 0.2, 0.2, 0.2], 10).count(0) == 4
    assert percentile([1, 2, 3, 4], 50) == 2 and percentile([1, 2, 3, 4], 99) == 4
    assert percentile(list(range(1, 101)), 99) == 99


class _ClosingHandler(_Handler):
    """Says keep-alive (HTTP/1.1, no Connection: close) but closes after each answer, as a server
    does with a connection idle past its timeout."""

    def do_POST(self) -> None:
        super().do_POST()
        self.close_connection = True


def test_a_connection_the_server_closed_is_replaced_not_counted_as_an_error() -> None:
    httpd = _Server(_ClosingHandler, expected=5)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        samples = open_loop(
            f"http://127.0.0.1:{httpd.server_address[1]}/v1/query",
            rate=10,
            duration_s=0.5,
            body=lambda i: {"i": 5 * i},  # fast, 200, not degraded
            headers=[{}],
            timeout_s=5,
        )
    finally:
        httpd.shutdown()
    assert [s.status for s in samples] == [200] * 5
