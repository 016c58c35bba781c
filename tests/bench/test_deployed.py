"""bench/deployed.py's client side: a streamed answer timed as a user sees it, and its figures."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from bench.deployed import Questions, RagSample, ask, held, prediction_errors, rag_clients_apart, tok_s


def _frame(event: str, data: dict) -> bytes:
    return f"id: 1-0\nevent: {event}\ndata: {json.dumps(data)}\n\n".encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        body = b"".join(
            [
                _frame("sources", {"sources": [{"chunk_id": "c1", "title": "t", "text": "x", "score": 0.5}]}),
                _frame("token", {"text": "Hel"}),
                _frame("token", {"text": "lo"}),
                _frame(
                    "done",
                    {
                        "answer": "Hello",
                        "degraded": False,
                        "usage": {"prompt_tokens": 40, "completion_tokens": 2},
                        "timings": {"predicted_wait_ms": 1500.0},
                    },
                ),
            ]
        )
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_ask_reads_the_stream_as_a_client(server: str) -> None:
    with httpx.Client() as client:
        s = ask(client, server, {}, "q?")
    assert s.status == 200 and not s.degraded
    assert (s.completion_tokens, s.prompt_tokens) == (2, 40)
    assert s.sources[0]["chunk_id"] == "c1"
    assert 0 < s.first_token_s <= s.e2e_s
    assert s.predicted_wait_s == 1.5


def test_figures() -> None:
    ok = RagSample("a", 200, e2e_s=2.0, completion_tokens=10, predicted_wait_s=3.0)
    degraded = RagSample("b", 200, degraded=True, e2e_s=0.1, predicted_wait_s=9.0)
    unknown = RagSample("c", 200, e2e_s=1.0, completion_tokens=6)
    assert prediction_errors([ok, degraded, unknown]) == [0.5]
    assert tok_s([ok, unknown]) == pytest.approx(16 / 3)
    assert held("mixed_efficiency", 0.95) == "yes"
    assert held("mixed_retrieval_p99_ratio", 3.5) == "**no**"
    assert held("predict_err_p90", math.nan) == "n/a"


def test_clients_in_a_process_of_their_own(server: str) -> None:
    run = rag_clients_apart(server, {}, Questions([f"q{i}?" for i in range(50)]), 2, 0.5).result(60)
    assert run.samples and all(s.status == 200 for s in run.samples)
    assert run.tok_s > 0
