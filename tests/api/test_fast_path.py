"""The fast path is only a faster entrance: every ``POST /v1/query`` it answers below the framework,
the framework's route answers alike (status, body but for the request id, headers that matter).
Two in-process apps on the test Redis, one without the fast path; an index and a cached answer
planted (no workers: what needs one is covered in tests/api/test_query.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from api.app import create_app
from api.fast_path import FastPath
from api.protocol import QueryRequest
from broker.keys import Keys
from broker.settings import Settings
from tests.helpers import own_prefix

CACHED = {
    "answer": "It opens at 7:15.",
    "usage": {"prompt_tokens": 12, "completion_tokens": 6},
    "timings": {"queue_ms": 1.0, "retrieval_ms": 2.0, "generation_ms": 30.0, "total_ms": 40.0},
    "sources": [
        {"chunk_id": "c1", "source": "cafe.md", "title": "Café", "text": "Opens at 7:15.", "score": 0.9}
    ],
    "cached": True,
}


@pytest.fixture(scope="module")
def clients(settings: Settings) -> Iterator[tuple[TestClient, TestClient]]:
    with own_prefix(settings, "fp") as s:
        fast = create_app(s)
        routed = create_app(s)
        # The same app as served, but for the fast path: every request reaches the route.
        routed.user_middleware = [m for m in routed.user_middleware if m.cls is not FastPath]
        with TestClient(fast) as a, TestClient(routed) as b:
            _plant(fast, {"query": "When does the café open?", "mode": "rag"})
            yield a, b


def _plant(app: FastAPI, body: dict[str, Any]) -> None:
    s, pipeline = app.state.settings, app.state.pipeline
    ctx = pipeline.validate(json.dumps(body).encode(), request_id="plant", model=QueryRequest)
    key = f"{Keys(s.redis.key_prefix).result_cache}:fp:v1:{pipeline.digest(ctx.asked)}"
    redis.Redis.from_url(s.redis.redis_url).set(key, json.dumps(CACHED))


ASKED = json.dumps({"query": "When does the café open?"}).encode()
CASES: list[tuple[str, bytes, dict[str, str]]] = [
    ("hit", ASKED, {}),
    ("hit, other spelling", json.dumps({"query": "  when does the CAFÉ open "}).encode(), {}),
    ("hit with a deadline", ASKED, {"x-request-deadline-ms": "900"}),
    ("empty query", b'{"query": ""}', {}),
    ("top_k", b'{"query": "q", "top_k": 99}', {}),
    ("unknown field", b'{"query": "q", "surprise": 1}', {}),
    ("wrong type", b'{"query": 5}', {}),
    ("not JSON", b'{"query": ', {}),
    ("not a JSON type", b'{"query": "q"}', {"content-type": "text/plain"}),
    ("bad deadline", b'{"query": "q"}', {"x-request-deadline-ms": "soon"}),
    ("unknown index", b'{"query": "q", "index": "nope"}', {}),
    ("too large", json.dumps({"query": "x" * 70_000}).encode(), {}),
]


@pytest.mark.parametrize(("case", "raw", "headers"), CASES, ids=[c[0] for c in CASES])
def test_fast_path_and_route_answer_alike(
    clients: tuple[TestClient, TestClient], case: str, raw: bytes, headers: dict[str, str]
) -> None:
    sent = {"content-type": "application/json", **headers}
    replies = [c.post("/v1/query", content=raw, headers=sent) for c in clients]
    fast, routed = replies
    assert fast.status_code == routed.status_code, (fast.text, routed.text)
    assert fast.headers["content-type"] == routed.headers["content-type"] == "application/json"
    bodies = [r.json() for r in replies]
    for reply, body in zip(replies, bodies, strict=True):
        assert body.pop("request_id") == reply.headers["x-request-id"]
        assert reply.headers.get("retry-after") == fast.headers.get("retry-after")
    assert bodies[0] == bodies[1]
    if case.startswith("hit"):
        assert fast.status_code == 200 and bodies[0]["cached"] is True and bodies[0]["answer"]


def test_the_fast_path_counts_and_times_like_the_route(clients: tuple[TestClient, TestClient]) -> None:
    counted = ("ragline_requests_total", {"endpoint": "/v1/query", "status": "200"})
    timed = ("ragline_request_seconds_count", {"endpoint": "/v1/query", "mode": "cached"})
    for c in clients:  # both apps record into this process's one registry: one more sample each
        before = [REGISTRY.get_sample_value(*m) or 0.0 for m in (counted, timed)]
        assert c.post("/v1/query", json={"query": "When does the café open?"}).status_code == 200
        after = [REGISTRY.get_sample_value(*m) or 0.0 for m in (counted, timed)]
        assert [a - b for a, b in zip(after, before, strict=True)] == [1.0, 1.0]
