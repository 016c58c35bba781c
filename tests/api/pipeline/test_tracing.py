"""The pipeline's steps as spans of the request's trace (OpenTelemetry's in-memory exporter, the
steps on tests/api/pipeline/test_pipeline.py's fakes): a computed answer's steps, a cached one's,
and the context its batch's task will carry; off, no span and nothing kept."""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from ragline.api.errors import ApiError
from ragline.api.pipeline.admission import Action, Decision
from ragline.api.query.render import json_answer
from ragline.broker import tracing
from ragline.broker.tracing import propagation
from ragline.broker.tracing.propagation import TRACE_HEADER

from tests.api.pipeline.test_pipeline import answered, context, parts
from tests.traced import named, recording

STEPS = ["ragline.result_cache", "ragline.admission", "ragline.hold", "ragline.enqueue"]


def _in_a_request(work: Any) -> tuple[Any, ReadableSpan, list[ReadableSpan]]:
    """``work`` awaited in a request's root span: its result, the root, and every span."""
    with recording() as exporter:
        tracer = tracing.tracer()
        assert tracer is not None

        async def go() -> Any:
            with tracer.start_as_current_span("request"):
                return await work()

        result = asyncio.run(go())
        spans = list(exporter.get_finished_spans())
    (root,) = named(spans, "request")
    return result, root, spans


def test_a_computed_answers_steps_are_spans_of_its_request() -> None:
    p = parts()
    p.streams.answer("r1")

    async def work() -> dict[str, Any]:
        answer = await answered(p, {"query": "when does it open?"})
        # What the batch's task carries: the context of this request's enqueue span.
        headers = propagation.batch_headers(["r1"])
        return {"answer": answer, "headers": headers}

    result, root, spans = _in_a_request(work)
    assert result["answer"]["answer"] == "At 7:15."
    steps = [s for s in spans if s.name.startswith("ragline.")]
    assert [s.name for s in steps] == STEPS  # in the order they ended
    assert root.context is not None
    for step in steps:
        assert step.parent is not None and step.parent.span_id == root.context.span_id
    cache, admission, _, enqueue = steps
    assert dict(cache.attributes or {}) == {"ragline.cache": "miss", "ragline.index_version": "v1"}
    assert dict(admission.attributes or {})["ragline.admission"] == "admit"
    assert enqueue.context is not None
    carried = result["headers"][TRACE_HEADER]["r1"]["traceparent"]
    assert carried.split("-")[1:3] == [f"{root.context.trace_id:032x}", f"{enqueue.context.span_id:016x}"]


def test_a_degraded_request_says_why_and_looks_up_again_inside_admission() -> None:
    p = parts(Decision(Action.DEGRADE, "generation_busy", "busy", wait_s=0.2))
    p.streams.answer("r1", answer=None)
    _, _, spans = _in_a_request(lambda: answered(p, {"query": "when does it open?"}))
    (admission,) = named(spans, "ragline.admission")
    attributes = dict(admission.attributes or {})
    assert attributes["ragline.admission"] == "degrade"
    assert attributes["ragline.admission.reason"] == "generation_busy"
    assert attributes["ragline.predicted_wait_s"] == 0.2
    second_lookup = named(spans, "ragline.result_cache")[1]
    assert admission.context is not None and second_lookup.parent is not None
    assert second_lookup.parent.span_id == admission.context.span_id
    propagation.batch_headers(["r1"])


def test_a_cache_hit_is_one_step() -> None:
    p = parts()
    p.streams.answer("r1")
    asyncio.run(answered(p, {"query": "when does it open?"}))  # stored, untraced

    async def work() -> bytes:
        return await json_answer(p.pipeline, context(p, {"query": "when does it open?"}, request_id="r2"))

    _, _, spans = _in_a_request(work)
    (cache,) = [s for s in spans if s.name.startswith("ragline.")]
    assert dict(cache.attributes or {})["ragline.cache"] == "hit"


def test_off_no_span_and_nothing_kept_for_the_batch() -> None:
    assert not tracing.active()
    p = parts()
    p.streams.answer("r1")
    assert asyncio.run(answered(p, {"query": "when does it open?"}))["answer"] == "At 7:15."
    assert propagation.batch_headers(["r1"]) is None


def test_a_refused_request_is_a_failed_admission_that_says_why() -> None:
    p = parts(Decision(Action.REJECT, "retrieval_busy", "overloaded", retry_after_s=7))

    async def work() -> int:
        try:
            await answered(p, {"query": "when does it open?"})
        except ApiError as refused:
            return refused.status
        return 200

    status, _, spans = _in_a_request(work)
    assert status == 503
    (admission,) = named(spans, "ragline.admission")
    assert not admission.status.is_ok
    assert dict(admission.attributes or {})["ragline.admission"] == "reject"
    assert not named(spans, "ragline.enqueue")
