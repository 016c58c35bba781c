"""Turning tracing on: off unless an OTLP endpoint or the console is named; the console's JSON
lines from several writers; OTLP over HTTP to a collector stand-in that decodes what it gets."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from ragline.broker import tracing
from ragline.broker.config.settings import Settings, TelemetrySettings

_OTEL = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED")


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (*_OTEL, "RAGLINE_TRACING", "RAGLINE_TRACING_FILE", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(name, raising=False)
    yield
    tracing.shutdown()


@pytest.mark.parametrize(
    ("tracing_setting", "env", "mode"),
    [
        ("", {}, "off"),
        ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "otlp"),
        ("", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, "otlp"),
        ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, "off"),
        ("console", {}, "console"),
        ("off", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "off"),
        ("console", {"OTEL_SDK_DISABLED": "true"}, "off"),
    ],
)
def test_off_unless_an_endpoint_or_the_console_is_named(
    monkeypatch: pytest.MonkeyPatch, tracing_setting: str, env: dict[str, str], mode: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if tracing_setting:
        monkeypatch.setenv("RAGLINE_TRACING", tracing_setting)
    settings = Settings().telemetry
    assert settings.mode == mode
    assert tracing.configure(settings, "test") is (mode != "off")
    assert tracing.active() is (mode != "off")


def test_off_leaves_tracing_as_it_was() -> None:
    assert not tracing.configure(TelemetrySettings(tracing="off"), "test")
    assert tracing.tracer() is None


def test_console_spans_are_json_lines_appended_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    path.write_text("")
    assert tracing.configure(TelemetrySettings(tracing="console", tracing_file=str(path)), "ragline-api")
    tracer = tracing.tracer()
    assert tracer is not None
    with tracer.start_as_current_span("outer"):
        tracing.record("inner", 1_000_000_000, 2_000_000_000, {"n": 3})
    tracing.shutdown()  # flushes the batch
    lines = path.read_text().splitlines()
    spans = {s["name"]: s for s in map(json.loads, lines)}
    assert set(spans) == {"outer", "inner"}
    assert spans["inner"]["parent_id"] == spans["outer"]["context"]["span_id"]
    assert spans["inner"]["attributes"] == {"n": 3}
    assert spans["outer"]["resource"]["attributes"]["service.name"] == "ragline-api"


_WRITER = """
import sys
from ragline.broker import tracing
from ragline.broker.config.settings import TelemetrySettings
tracing.configure(TelemetrySettings(tracing="console", tracing_file=sys.argv[1]), "writer-" + sys.argv[2])
tracer = tracing.tracer()
for i in range(300):
    with tracer.start_as_current_span("s", attributes={"pad": "x" * 3000, "i": i}):
        pass
tracing.shutdown()
"""


def test_processes_sharing_the_file_never_interleave_a_line(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    env = {**os.environ, "OTEL_BSP_SCHEDULE_DELAY": "1"}
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(n)], env=env) for n in range(3)
    ]
    for w in writers:
        assert w.wait(60) == 0
    spans = [json.loads(line) for line in path.read_text().splitlines()]  # each line whole
    assert len(spans) == 900
    by_writer = {s["resource"]["attributes"]["service.name"] for s in spans}
    assert by_writer == {"writer-0", "writer-1", "writer-2"}


class _Collector(http.server.BaseHTTPRequestHandler):
    """OTLP/HTTP's trace endpoint: keeps each request's decoded body."""

    received: ClassVar[list[tuple[str, ExportTraceServiceRequest]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.received.append((self.path, request))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


def test_otlp_over_http_reaches_the_collector_the_endpoint_names(monkeypatch: pytest.MonkeyPatch) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "5")
        assert tracing.configure(Settings().telemetry, "ragline-retrieval")
        tracer = tracing.tracer()
        assert tracer is not None
        with tracer.start_as_current_span("ragline.retrieve"):
            pass
        tracing.shutdown()
    finally:
        server.shutdown()
    ((path, request),) = _Collector.received
    assert path == "/v1/traces"
    (resource_spans,) = request.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"]
    assert service == "ragline-retrieval"
    assert [s.name for scope in resource_spans.scope_spans for s in scope.spans] == ["ragline.retrieve"]


def test_otel_service_name_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "search-api")
    path = tmp_path / "spans.jsonl"
    tracing.configure(TelemetrySettings(tracing="console", tracing_file=str(path)), "ragline-api")
    tracer = tracing.tracer()
    assert tracer is not None
    tracer.start_span("s").end()
    tracing.shutdown()
    (span,) = map(json.loads, path.read_text().splitlines())
    assert span["resource"]["attributes"]["service.name"] == "search-api"
