"""bench/deployed.py's client side: a streamed answer timed as a user sees it, and its figures."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
from ragline.broker.config import host

from bench.deployed import (
    TARGETS,
    Questions,
    RagSample,
    against_engine,
    ask,
    engine_cores,
    held,
    prediction_errors,
    rag_clients,
    rag_clients_apart,
    start_pinned,
    tok_s,
)


def _frame(event: str, data: dict) -> bytes:
    return f"id: 1-0\nevent: {event}\ndata: {json.dumps(data)}\n\n".encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    # A question's answer waits this many seconds, or until this event is set.
    hold: ClassVar[dict[str, float | threading.Event]] = {}

    def do_POST(self) -> None:
        question = json.loads(self.rfile.read(int(self.headers["content-length"])))["query"]
        wait = self.hold.get(question)
        if isinstance(wait, threading.Event):
            wait.wait(10)
        elif wait:
            time.sleep(wait)
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


@pytest.mark.slow  # a spawned Python process
def test_clients_in_a_process_of_their_own(server: str) -> None:
    run = rag_clients_apart(server, {}, Questions([f"q{i}?" for i in range(50)]), 2, 0.5).result(60)
    assert run.samples and all(s.status == 200 for s in run.samples)
    assert run.tok_s > 0


def test_a_drain_leaves_out_the_answers_still_out_when_it_ends(server: str) -> None:
    """One client: its first answer comes after 0.5 s, its second never before the run returns.
    With a drain, the run ends at ``duration + drain`` with the first answer only, and says that
    a client was still waiting (its read timeout, ``duration + drain`` from its second question,
    comes later)."""
    release = threading.Event()
    _Handler.hold = {"first?": 0.5, "second?": release}
    try:
        run = rag_clients(server, {}, Questions(["first?", "second?"]), 1, duration_s=0.8, drain_s=0.2)
    finally:
        release.set()
        _Handler.hold = {}
    assert [s.question for s in run.samples] == ["first?"]
    assert run.partial


def test_the_lone_answer_is_compared_with_the_engine_on_every_core_and_on_its_own_cores() -> None:
    lone = [
        RagSample("a", 200, first_token_s=0.50, e2e_s=2.0, completion_tokens=20),
        RagSample("b", 200, first_token_s=0.70, e2e_s=2.0, completion_tokens=20),
    ]
    every_core = [{"first_token_s": 0.3, "e2e_s": 1.0, "tokens": 20}] * 2
    same_cores = [{"first_token_s": 0.58, "e2e_s": 1.9, "tokens": 20}] * 2
    f = against_engine(lone, every_core) | against_engine(lone, same_cores, "_same_cores")
    assert f["lone_gen_over_engine"] == pytest.approx(0.5)
    assert f["lone_first_token_over_engine_ms"] == pytest.approx(300.0)
    assert f["lone_gen_over_engine_same_cores"] == pytest.approx(0.95)
    assert f["lone_first_token_over_engine_same_cores_ms"] == pytest.approx(20.0)
    # The targets: within 10% of the engine's speed, and 50 ms of its first token, on its cores.
    assert TARGETS["lone_gen_over_engine_same_cores"] == (">=", 0.9)
    assert TARGETS["lone_first_token_over_engine_same_cores_ms"] == ("<=", 50.0)
    assert held("lone_gen_over_engine_same_cores", f["lone_gen_over_engine_same_cores"]) == "yes"
    assert held("lone_first_token_over_engine_same_cores_ms", 51.0) == "**no**"
    assert held("lone_gen_over_engine", f["lone_gen_over_engine"]) == "**no**"


def test_the_engines_cores_are_those_ragline_up_gives_its_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    eight = host.Host(cores=tuple(range(8)), memory_bytes=2**34, cpu_flags=frozenset())
    monkeypatch.setattr(host, "detect", lambda: eight)
    env = {"RAGLINE_HOME": "/tmp/unused"}
    assert engine_cores(env) == host.core_split(eight).engine == (2, 3, 4, 5, 6, 7)
    assert engine_cores({**env, "RAGLINE_SPLIT_CORES": "false"}) is None
    gpu_host = host.Host(eight.cores, eight.memory_bytes, eight.cpu_flags, gpus=(host.Gpu(0, "GPU", 0, 0),))
    monkeypatch.setattr(host, "detect", lambda: gpu_host)
    assert engine_cores(env) is None  # the engine computes on the GPU: nothing to match


@pytest.mark.slow  # a child process
def test_the_bare_engine_runs_on_the_cores_it_is_given(tmp_path: Path) -> None:
    one = min(os.sched_getaffinity(0))
    out = tmp_path / "affinity"
    cmd = [
        sys.executable,
        "-c",
        f"import os; open({str(out)!r}, 'w').write(repr(sorted(os.sched_getaffinity(0))))",
    ]
    assert start_pinned(cmd, dict(os.environ), (one,)).wait(30) == 0
    assert out.read_text() == repr([one])
    assert start_pinned(cmd, dict(os.environ), None).wait(30) == 0
    assert out.read_text() == repr(sorted(os.sched_getaffinity(0)))
