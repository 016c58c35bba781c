"""The tracing hook, with OpenTelemetry's in-memory exporter: a task of one request goes on in its
trace after a span of its queue wait; a batch is a trace of its own, linked both ways with each
request it serves, whose next task is sent on from the request's span; off, it keeps nothing."""

from __future__ import annotations

from typing import Any

import pytest
from celery.exceptions import Reject
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from ragline.broker import tracing
from ragline.broker.tracing import propagation
from ragline.workers.task_call import TaskCall, TaskCancelled, run
from ragline.workers.tracing import Served, Traced, generation_phases

from tests.traced import named, recording

PICKED_AT = 1_700_000_100.0


def _sent(*request_ids: str) -> tuple[dict[str, Any], dict[str, trace.SpanContext]]:
    """Task headers as the API sends them, one enqueue span per request; and those spans."""
    tracer = tracing.tracer()
    assert tracer is not None
    spans = {}
    for rid in request_ids:
        with tracer.start_as_current_span(f"enqueue {rid}") as span:
            propagation.remember(rid)
            spans[rid] = span.get_span_context()
    headers = propagation.batch_headers(request_ids)
    assert headers is not None
    return headers, spans


def _call(headers: dict[str, Any] | None) -> TaskCall[Any]:
    return TaskCall("ragline.test", {}, task_id="t1", picked_at=PICKED_AT, headers=headers)


def test_a_task_of_one_request_goes_on_in_its_trace_after_its_queue_wait() -> None:
    hook: Traced[Any] = Traced("work", lambda call: [Served("r1", PICKED_AT - 2.5)], queue_wait="waited")
    with recording() as exporter:
        headers, sent = _sent("r1")

        def body(call: TaskCall[Any]) -> None:
            tracing.record("inside", 1, 2)

        run(_call(headers), [hook], body)
        spans = exporter.get_finished_spans()
    (waited,) = named(spans, "waited")
    (work,) = named(spans, "work")
    (inside,) = named(spans, "inside")
    for span in (waited, work):
        assert span.parent is not None and span.parent.span_id == sent["r1"].span_id
        assert span.context is not None and span.context.trace_id == sent["r1"].trace_id
    assert (
        inside.parent is not None
        and work.context is not None
        and inside.parent.span_id == work.context.span_id
    )
    assert waited.end_time == work.start_time == tracing.unix_ns(PICKED_AT)
    assert waited.start_time == tracing.unix_ns(PICKED_AT - 2.5)
    assert work.kind is SpanKind.CONSUMER
    assert dict(work.attributes or {})["ragline.request_id"] == "r1"
    assert trace.get_current_span() is trace.INVALID_SPAN  # its context left with it


def test_a_batch_is_a_trace_of_its_own_linked_both_ways_with_each_request() -> None:
    served = [Served("a", PICKED_AT - 1), Served("b", PICKED_AT - 1)]
    hook: Traced[Any] = Traced("retrieve", lambda call: served, batch="retrieve.batch")
    next_headers: dict[str, Any] = {}
    with recording() as exporter:
        headers, sent = _sent("a", "b")

        def body(call: TaskCall[Any]) -> None:
            tracing.record("embed", 1, 2)
            for rid in ("a", "b"):
                next_headers[rid] = hook.headers(call, rid)

        run(_call(headers), [hook], body)
        spans = exporter.get_finished_spans()
    (batch,) = named(spans, "retrieve.batch")
    (embed,) = named(spans, "embed")
    assert batch.parent is None and batch.context is not None
    assert batch.context.trace_id not in {s.trace_id for s in sent.values()}
    assert embed.parent is not None and embed.parent.span_id == batch.context.span_id
    assert {link.context.span_id for link in batch.links} == {s.span_id for s in sent.values()}
    assert dict(batch.attributes or {})["ragline.batch.size"] == 2
    by_request = {dict(s.attributes or {})["ragline.request_id"]: s for s in named(spans, "retrieve")}
    for rid, enqueue in sent.items():
        mine = by_request[rid]
        assert mine.parent is not None and mine.parent.span_id == enqueue.span_id
        assert mine.context is not None and mine.context.trace_id == enqueue.trace_id
        assert [link.context.span_id for link in mine.links] == [batch.context.span_id]
        # Its next task goes on from this request's span, in this request's trace.
        carrier = propagation.carriers_of(next_headers[rid])[rid]
        following = trace.get_current_span(propagation.context_of(carrier)).get_span_context()
        assert (following.trace_id, following.span_id) == (mine.context.trace_id, mine.context.span_id)


def test_a_failed_body_fails_the_spans_and_a_requeue_or_cancel_is_named() -> None:
    hook: Traced[Any] = Traced("work", lambda call: [Served("r1", PICKED_AT)])

    def broken(call: TaskCall[Any]) -> None:
        raise RuntimeError("engine gone")

    def requeued(call: TaskCall[Any]) -> None:
        raise Reject("stopping", requeue=True)

    def cancelled(call: TaskCall[Any]) -> None:
        raise TaskCancelled("its request was cancelled")

    with recording() as exporter:
        with pytest.raises(RuntimeError):
            run(_call(None), [hook], broken)
        with pytest.raises(Reject):
            run(_call(None), [hook], requeued)
        with pytest.raises(TaskCancelled):
            run(_call(None), [hook], cancelled)
        failed, handed_back, stopped = exporter.get_finished_spans()
    assert not failed.status.is_ok and [e.name for e in failed.events] == ["exception"]
    for span, outcome in ((handed_back, "Reject"), (stopped, "TaskCancelled")):
        assert span.status.is_unset
        assert dict(span.attributes or {})["ragline.task.outcome"] == outcome


def test_a_message_without_trace_headers_starts_a_trace() -> None:
    hook: Traced[Any] = Traced("work", lambda call: [Served("r1", PICKED_AT)])
    with recording() as exporter:
        run(_call(None), [hook], lambda call: None)
        (work,) = exporter.get_finished_spans()
    assert work.parent is None


def test_off_the_hook_keeps_nothing_and_sends_no_headers() -> None:
    hook: Traced[Any] = Traced("work", lambda call: [Served("r1", PICKED_AT)], batch="batch")
    seen: list[object] = []

    def body(call: TaskCall[Any]) -> None:
        seen.append(hook.headers(call, "r1"))
        seen.append(call.has(hook))

    run(_call(None), [hook], body)
    assert seen == [None, False]


def test_generation_phases_split_at_the_first_token() -> None:
    with recording() as exporter:
        generation_phases(100.0, 250.0, 1000.0, prompt_tokens=40, tokens=12)
        prefill, decode = exporter.get_finished_spans()
    assert (prefill.name, decode.name) == ("ragline.generate.prefill", "ragline.generate.decode")
    assert prefill.end_time == decode.start_time
    assert prefill.end_time is not None and prefill.start_time is not None and decode.end_time is not None
    assert prefill.end_time - prefill.start_time == pytest.approx(250e6, abs=1000)
    assert decode.end_time - decode.start_time == pytest.approx(750e6, abs=1000)
    assert dict(decode.attributes or {}) == {"gen_ai.usage.output_tokens": 12}
