"""The fast path is only a faster entrance: every ``POST /v1/query`` it answers below the framework,
the framework's route answers alike (status, body but for the request id, headers that matter).
Two in-process apps on the test Redis, one without the fast path; an index and a cached answer
planted (no workers: what needs one is covered in tests/api/query/test_query.py). Then the
middleware alone on the pipeline's fakes (tests/api/pipeline/test_pipeline.py): what it serves,
what it passes on, and what it sends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from ragline.api.app import create_app
from ragline.api.pipeline import Pipeline
from ragline.api.pipeline.fast_path import FastPath
from ragline.api.query.protocol import QueryRequest
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys
from starlette.types import Receive, Scope, Send

from tests.api.pipeline.test_pipeline import Parts, parts
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
        # A name the API answers to (TestClient's own "testserver" is none).
        local = "http://localhost"
        with TestClient(fast, base_url=local) as a, TestClient(routed, base_url=local) as b:
            _plant(fast, {"query": "When does the café open?", "mode": "rag"})
            yield a, b


def _plant(app: FastAPI, body: dict[str, Any]) -> None:
    s, pipeline = app.state.settings, app.state.pipeline
    ctx = pipeline.validate(json.dumps(body).encode(), request_id="plant", model=QueryRequest)
    key = f"{Keys(s.redis.key_prefix).result_cache}:fp:v1:{pipeline.digest(ctx.asked)}"
    redis.Redis.from_url(s.redis.redis_url).set(key, json.dumps(CACHED))


JSON = (b"content-type", b"application/json")
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


# -- the middleware alone, on the pipeline's narrow fakes (unit: no Redis, no app) --------------


class _Inner:
    """The app behind the fast path: records what reached it."""

    def __init__(self) -> None:
        self.reached: list[tuple[str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.reached.append((scope.get("method", ""), scope.get("path", "")))


@dataclass
class _Route:
    path: str
    methods: set[str]


@dataclass
class _App:
    """What the fast path reads from ``scope["app"]``: the pipeline and the routes."""

    pipeline: Pipeline
    routes: list[_Route] = field(
        default_factory=lambda: [_Route("/v1/query", {"GET"}), _Route("/v1/query", {"POST"})]
    )

    @property
    def state(self) -> SimpleNamespace:
        return SimpleNamespace(pipeline=self.pipeline)


def _call(
    fast: FastPath,
    app: _App,
    chunks: list[bytes] | None,
    *,
    method: str = "POST",
    path: str = "/v1/query",
    headers: list[tuple[bytes, bytes]] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One request through the middleware: its scope afterwards and what it sent. ``chunks``
    None: the client leaves before its body is complete."""
    scope: dict[str, Any] = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": headers if headers is not None else [(b"content-type", b"application/json")],
        "state": {"request_id": "req-1", "principal": "alice"},
        "app": app,
    }
    messages: list[dict[str, Any]] = (
        [{"type": "http.disconnect"}]
        if chunks is None
        else [
            {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
            for i, c in enumerate(chunks)
        ]
    )
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def go() -> None:
        await fast(scope, receive, send)
        await app.pipeline.aclose()

    asyncio.run(go())
    return scope, sent


def _hit_parts() -> Parts:
    p = parts()
    asked = p.pipeline.validate(ASKED, request_id="plant", model=QueryRequest, single_flight=True).asked
    p.cache.bodies[p.cache.key("docs", p.pipeline.digest(asked))] = json.dumps(CACHED).encode()
    return p


@pytest.mark.parametrize(
    ("method", "path", "scope_type"),
    [("GET", "/v1/query", "http"), ("POST", "/v1/query/stream", "http"), ("POST", "/v1/query", "websocket")],
)
def test_everything_but_post_query_goes_on_to_the_app(method: str, path: str, scope_type: str) -> None:
    inner = _Inner()
    fast = FastPath(inner)

    async def go() -> None:
        scope = {"type": scope_type, "method": method, "path": path}
        await fast(scope, _never_called, _never_called)

    asyncio.run(go())
    assert inner.reached == [(method, path)]


async def _never_called(*args: object) -> Any:
    raise AssertionError("the fast path touched a request it does not serve")


def test_a_cache_hit_is_answered_below_the_app_with_the_route_labelled() -> None:
    inner, p = _Inner(), _hit_parts()
    app = _App(p.pipeline)
    scope, sent = _call(FastPath(inner), app, [ASKED[:10], ASKED[10:]])  # a body in two parts
    assert inner.reached == []
    assert scope["route"] is app.routes[1]  # the POST route: what the request counter labels by
    assert scope["state"]["answered_as"] == "cached"
    start, body = sent
    assert start["status"] == 200
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"application/json"
    assert int(headers[b"content-length"]) == len(body["body"])
    answer = json.loads(body["body"])
    assert answer["cached"] is True and answer["answer"] == CACHED["answer"]
    assert answer["request_id"] == "req-1"
    assert p.queue.batches == []  # a hit sends nothing


@pytest.mark.parametrize(
    ("raw", "headers", "status", "needle"),
    [
        (b'{"query": ""}', [(b"content-type", b"application/json")], 422, "empty"),
        (b'{"query": ', [(b"content-type", b"application/json")], 400, "JSON"),
        (b'{"query": "q"}', [(b"content-type", b"text/plain")], 415, "Content-Type"),
        (b'{"query": "q"}', [], 415, "got none"),
        (b'{"query": "q"}', [JSON, (b"x-request-deadline-ms", b"soon")], 422, "Deadline"),
        (b'{"query": "q", "index": "nope"}', [JSON], 404, "nope"),
    ],
)
def test_bad_input_is_the_one_error_mapping(
    raw: bytes, headers: list[tuple[bytes, bytes]], status: int, needle: str
) -> None:
    scope, sent = _call(FastPath(_Inner()), _App(parts().pipeline), [raw], headers=headers)
    start, body = sent
    assert start["status"] == status
    error = json.loads(body["body"])
    assert needle in error["message"] and error["request_id"] == "req-1"
    assert dict(start["headers"])[b"x-request-id"] == b"req-1"
    assert "answered_as" not in scope["state"]


def test_the_first_of_a_repeated_header_counts() -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-type", b"text/plain"),
        (b"x-request-deadline-ms", b"900"),
        (b"x-request-deadline-ms", b"soon"),
    ]
    _, sent = _call(FastPath(_Inner()), _App(_hit_parts().pipeline), [ASKED], headers=headers)
    assert sent[0]["status"] == 200


def test_a_client_that_leaves_before_its_body_is_complete_gets_nothing() -> None:
    inner, p = _Inner(), parts()
    scope, sent = _call(FastPath(inner), _App(p.pipeline), None)
    assert sent == [] and inner.reached == [] and p.queue.batches == []
    assert "answered_as" not in scope["state"]
