"""A request's trace context in task headers: taken where it enters the coalescer, framed with
its batch, read back by request id; malformed headers are ignored, never fatal."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from ragline.broker import tracing
from ragline.broker.tracing import propagation
from ragline.broker.tracing.propagation import TRACE_HEADER

from tests.traced import recording


def _span_of(context: object) -> trace.SpanContext:
    return trace.get_current_span(context).get_span_context()  # type: ignore[arg-type]


def test_each_request_of_a_batch_carries_its_own_context() -> None:
    with recording():
        tracer = tracing.tracer()
        assert tracer is not None
        sent = {}
        for rid in ("a", "b"):
            with tracer.start_as_current_span(f"enqueue {rid}") as span:
                propagation.remember(rid)
                sent[rid] = span.get_span_context()
        headers = propagation.batch_headers(["a", "b", "never-remembered"])
        assert headers is not None and set(headers[TRACE_HEADER]) == {"a", "b"}
        carriers = propagation.carriers_of(headers)
        for rid, span_context in sent.items():
            received = _span_of(propagation.context_of(carriers[rid]))
            assert (received.trace_id, received.span_id) == (span_context.trace_id, span_context.span_id)
        # Taken with its batch: a later batch does not carry it again.
        assert propagation.batch_headers(["a", "b"]) is None


def test_a_task_of_one_request_is_sent_on_from_a_span() -> None:
    with recording():
        tracer = tracing.tracer()
        assert tracer is not None
        span = tracer.start_span("retrieve")
        headers = propagation.task_headers("r1", trace.set_span_in_context(span))
        assert headers is not None
        received = _span_of(propagation.context_of(propagation.carriers_of(headers)["r1"]))
        assert received.span_id == span.get_span_context().span_id


@pytest.mark.parametrize(
    "headers",
    [
        None,
        {},
        {TRACE_HEADER: "00-abc"},
        {TRACE_HEADER: ["r1"]},
        {TRACE_HEADER: {"r1": "traceparent"}},
        {TRACE_HEADER: {"r1": {"traceparent": 7}}},
        {TRACE_HEADER: {"r1": {"traceparent": "not a traceparent"}}},
    ],
)
def test_malformed_headers_start_a_new_trace(headers: object) -> None:
    carriers = propagation.carriers_of(headers)  # type: ignore[arg-type]
    assert not _span_of(propagation.context_of(carriers.get("r1"))).is_valid


def test_an_http_callers_traceparent_is_continued() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    received = _span_of(propagation.http_context([(b"traceparent", parent.encode()), (b"host", b"x")]))
    assert f"{received.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert f"{received.span_id:016x}" == "b7ad6b7169203331"
