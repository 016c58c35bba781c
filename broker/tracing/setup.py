"""Turning tracing on in a process: its tracer provider, and where its spans go.

Each process (the API, each worker) has a provider of its own, made here and not set as
OpenTelemetry's global one (which a process may set only once): ``install`` replaces it, so a
test can trace into an in-memory exporter and stop again. Spans are exported in batches on the
provider's own thread (``BatchSpanProcessor``, tuned by OpenTelemetry's ``OTEL_BSP_*``
variables), never on a request's path.

OpenTelemetry's SDK and exporters are imported only here and only once tracing is on: a process
that does not trace loads none of them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ragline.broker.config.settings import TelemetrySettings
from ragline.broker.tracing.state import STATE

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter


def configure(settings: TelemetrySettings, service: str) -> bool:
    """Trace this process as ``service`` (its ``service.name``, unless ``OTEL_SERVICE_NAME`` says
    otherwise) when the settings turn tracing on; False, and nothing changed, when they do not."""
    mode = settings.mode
    if mode == "off":
        return False
    install(json_lines(settings.tracing_file) if mode == "console" else otlp_exporter(), service)
    return True


def install(exporter: SpanExporter, service: str, *, batched: bool = True) -> None:
    """Trace into ``exporter`` from now on (the provider before, if any, is flushed and shut
    down); ``batched`` False exports each span as it ends (tests)."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    shutdown()
    named = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service}
    provider = TracerProvider(resource=Resource.create({"service.namespace": "ragline", **named}))
    provider.add_span_processor(BatchSpanProcessor(exporter) if batched else SimpleSpanProcessor(exporter))
    STATE.provider, STATE.tracer = provider, provider.get_tracer("ragline")


def shutdown() -> None:
    """Export what is left and stop tracing (a process's last step; idempotent)."""
    provider = STATE.provider
    STATE.provider = STATE.tracer = None
    if provider is not None:
        provider.shutdown()


def otlp_exporter() -> SpanExporter:
    """OTLP to the collector OpenTelemetry's own variables name (endpoint, headers, timeout,
    certificates), over ``http/protobuf`` (the specification's default) or ``grpc``."""
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol.strip() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

        return Grpc()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    return Http()


def json_lines(path: str) -> SpanExporter:
    """Console spans: JSON lines appended to ``path`` (stdout when empty)."""
    from ragline.broker.tracing.json_lines import JsonLines

    return JsonLines(path)
