"""The open-loop generator sends on schedule, records every answer, and never waits for the server."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.openloop import _weighted, open_loop, percentile


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the generator reuses its connections

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        i = body["i"]
        if i % 4 == 3:
            time.sleep(0.3)  # slow answers must not delay the next sends
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
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1/query"
    httpd.shutdown()


def test_open_loop_keeps_its_schedule_and_records_outcomes(server: str) -> None:
    started = time.monotonic()
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
    assert time.monotonic() - started < 2.0  # the slow answers overlapped; nothing waited on them
    assert samples[-1].sent == pytest.approx(39 / 40, abs=0.1)
    assert max(s.lag for s in samples) < 0.1
    outcomes = {s.outcome for s in samples}
    assert outcomes == {"full", "degraded", "429"}
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
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _ClosingHandler)
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
