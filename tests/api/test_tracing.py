"""Each request's trace begins at the door: the tracing middleware's server span, named by the
route, carrying the request id, holding what the app does, continuing a caller's trace. Installed
only when tracing is on: an API that does not trace loads none of OpenTelemetry's tracing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from fastapi.testclient import TestClient
from opentelemetry.trace import SpanKind
from ragline.api.app import create_app
from ragline.api.tracing import Tracing
from ragline.broker import tracing
from ragline.broker.config.settings import Settings
from starlette.types import Message, Receive, Scope, Send

from tests.helpers import own_prefix
from tests.traced import exported, recording

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    """What the stack inside does: sets the request id and the route, works in a span, answers."""
    scope["state"]["request_id"] = "req-1"
    scope["route"] = SimpleNamespace(path="/v1/things/{name}")
    tracer = tracing.tracer()
    assert tracer is not None
    with tracer.start_as_current_span("inside"):
        pass
    status = 503 if scope["path"].endswith("broken") else 200
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def _serve(path: str, headers: list[tuple[bytes, bytes]]) -> list[Message]:
    scope = {"type": "http", "method": "GET", "path": path, "headers": headers, "state": {}}
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(Tracing(_app)(scope, receive, send))
    return sent


def test_the_server_span_is_the_requests_root_named_by_its_route() -> None:
    with recording() as exporter:
        _serve("/v1/things/a", [(b"traceparent", CALLER.encode())])
        inside, server = exporter.get_finished_spans()
    assert server.name == "GET /v1/things/{name}" and server.kind is SpanKind.SERVER
    attributes = dict(server.attributes or {})
    assert attributes["ragline.request_id"] == "req-1"
    assert attributes["http.route"] == "/v1/things/{name}"
    assert attributes["http.response.status_code"] == 200
    assert server.context is not None and inside.parent is not None
    assert inside.parent.span_id == server.context.span_id
    # The caller's trace goes on.
    assert f"{server.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert server.parent is not None and f"{server.parent.span_id:016x}" == "b7ad6b7169203331"


def test_a_server_error_fails_the_span() -> None:
    with recording() as exporter:
        _serve("/v1/things/broken", [])
        _, server = exporter.get_finished_spans()
    assert not server.status.is_ok and dict(server.attributes or {})["http.response.status_code"] == 503
    assert server.parent is None


def test_an_api_that_traces_exports_each_request_under_its_id(settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    with own_prefix(settings, "tr") as s:
        traced = s.replace(tracing="console", tracing_file=str(path))
        with TestClient(create_app(traced), base_url="http://localhost") as client:  # a name it answers to
            reply = client.post("/v1/query", json={"query": "anything", "index": "nowhere"})
        # The app's end exported what was left.
    assert reply.status_code == 404
    assert not tracing.active()
    spans = exported(path)
    (server,) = [s for s in spans if s.kind == "SpanKind.SERVER"]
    assert server.name == "POST /v1/query" and server.service == "ragline-api"
    assert server.attributes["ragline.request_id"] == reply.headers["x-request-id"]
    assert server.attributes["http.response.status_code"] == 404
    (cache,) = [s for s in spans if s.name == "ragline.result_cache"]
    assert cache.parent_id == server.span_id and cache.trace_id == server.trace_id


_UNTRACED = """
import sys
from fastapi.testclient import TestClient
from ragline.api.app import create_app
with TestClient(create_app(), base_url="http://localhost") as client:
    client.get("/healthz")
    client.post("/v1/query", json={"query": "x", "index": "nowhere"})
tracing = ("opentelemetry.sdk.trace", "opentelemetry.exporter", "ragline.api.tracing")
print(",".join(sorted(m for m in sys.modules if m.startswith(tracing))))
"""


def test_an_api_that_does_not_trace_loads_no_tracing(redis_url: str) -> None:
    # (redis-py imports OpenTelemetry's API and metrics SDK for its own metrics, and the MCP SDK its
    # API's propagators; neither its tracing SDK.)
    out = subprocess.run(
        [sys.executable, "-c", _UNTRACED],
        capture_output=True,
        text=True,
        timeout=120,
        env={"RAGLINE_REDIS_URL": redis_url, "RAGLINE_DEV_MODE": "true", "PATH": ""},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
