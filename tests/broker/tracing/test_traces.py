"""One connected trace per request, through real workers.

A stack of its own (API, retrieval worker; a generation worker for the RAG test) with tracing on
in console mode: every process appends its spans, as JSON lines, to one file, and the test joins
them by trace id (an in-memory exporter would see only the test's own process). Each request's
trace must be one tree under the API's server span, holding the pipeline's steps, the retrieval
worker's span for the request (linked to its batch's span, which holds the embedding and the
search and links back to the request), and for a RAG request the generation queue's wait, the
generation task, its prefill and its decode.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from ragline.broker.config.settings import Settings

from tests.helpers import Proc, Stack, parse_sse, redis_db_after, stack_on_db, wait_for_workers, worker
from tests.traced import Exported, exported

API_STEPS = {"ragline.result_cache", "ragline.admission", "ragline.hold", "ragline.enqueue"}
RAG_SPANS = {
    "ragline.generation.queue_wait",
    "ragline.generate",
    "ragline.generate.prefill",
    "ragline.generate.decode",
}


@dataclass
class Traced:
    stack: Stack
    spans_file: Path
    logs: Path

    def spans(self) -> list[Exported]:
        return exported(self.spans_file)

    def trace_of(self, request_id: str, *, wanted: set[str], timeout: float = 30) -> list[Exported]:
        """The spans of ``request_id``'s trace, once they include every name in ``wanted`` (the
        processes export in batches, a moment after each span ends)."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans()
            roots = [
                s
                for s in spans
                if s.attributes.get("ragline.request_id") == request_id and s.kind == "SpanKind.SERVER"
            ]
            if roots:
                mine = [s for s in spans if s.trace_id == roots[0].trace_id]
                if wanted <= {s.name for s in mine}:
                    return mine
            if time.monotonic() > deadline:
                names = sorted({s.name for s in mine}) if roots else "no server span"
                pytest.fail(f"{request_id}'s trace did not get {sorted(wanted)} in time: {names}")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def stack(settings: Settings, test_index: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    logs = tmp_path_factory.mktemp("tracing-logs")
    spans_file = logs / "spans.jsonl"
    # Three databases after the session's: one after it is the documents' and durability tests',
    # two the contract tests'.
    url = redis_db_after(settings.redis.redis_url, 3, "RAGLINE_TEST_TRACING_REDIS_URL")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within a moment, not OpenTelemetry's 5 s
        with stack_on_db(
            settings,
            url,
            ("retrieval",),
            logs,
            tracing="console",
            tracing_file=str(spans_file),
            # Admission must not degrade or refuse on a busy host: the traces are the point.
            default_deadline_ms=180_000,
        ) as running:
            yield Traced(running, spans_file, logs)


@pytest.fixture(scope="module")
def generation(stack: Traced, prepared_model: Path) -> Iterator[Proc]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        proc = worker(
            "generation", stack.stack.settings.replace(max_num_seqs=4), stack.logs / "generation.log"
        )
    proc.start()
    try:
        wait_for_workers(stack.stack.settings, ("generation",), [proc], timeout=600)
        yield proc
    finally:
        proc.stop(timeout=60)


def assert_one_tree(spans: list[Exported], request_id: str) -> Exported:
    """``spans`` are one tree under the API's server span of ``request_id``: returns that root."""
    (root,) = [s for s in spans if s.parent_id is None]
    assert root.kind == "SpanKind.SERVER" and root.service == "ragline-api"
    assert root.attributes["ragline.request_id"] == request_id
    ids = {s.span_id for s in spans}
    assert len(ids) == len(spans)
    orphans = [s.name for s in spans if s.parent_id is not None and s.parent_id not in ids]
    assert not orphans, f"spans whose parent is not in the trace: {orphans}"
    return root


def only(spans: list[Exported], name: str) -> Exported:
    (span,) = [s for s in spans if s.name == name]
    return span


def _unique(question: str) -> str:
    return f"{question} {uuid.uuid4().hex[:8]}"  # never a cached answer


def _ask_concurrently(base: str, bodies: list[dict[str, Any]], post: Callable[..., Any]) -> list[str]:
    with httpx.Client(base_url=base, timeout=300) as client, ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda body: post(client, body), bodies))


def _json(client: httpx.Client, body: dict[str, Any]) -> str:
    reply = client.post("/v1/query", json=body)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["request_id"])


def _stream(client: httpx.Client, body: dict[str, Any]) -> str:
    with client.stream("POST", "/v1/query/stream", json=body) as reply:
        assert reply.status_code == 200, reply.read()
        events = list(parse_sse(reply.iter_lines()))
    assert events[-1][1] == "done", events
    return str(events[-1][2]["request_id"])


def test_coalesced_requests_each_have_one_trace_linked_with_their_batch(stack: Traced) -> None:
    questions = [_unique(f"When does Café Lumière open? ({n})") for n in range(8)]
    request_ids = _ask_concurrently(
        stack.stack.base, [{"query": q, "mode": "retrieval"} for q in questions], _json
    )
    by_span = {s.span_id: s for s in stack.spans()}
    batch_sizes = []
    for request_id in request_ids:
        spans = stack.trace_of(request_id, wanted=API_STEPS | {"ragline.retrieve"})
        root = assert_one_tree(spans, request_id)
        assert root.name == "POST /v1/query"
        assert {s.service for s in spans} == {"ragline-api", "ragline-retrieval"}
        enqueue, retrieve = only(spans, "ragline.enqueue"), only(spans, "ragline.retrieve")
        assert (
            retrieve.parent_id == enqueue.span_id and retrieve.attributes["ragline.request_id"] == request_id
        )
        # The batch it was coalesced into: a trace of its own, linked both ways.
        (batch_id,) = retrieve.linked_to()
        by_span |= {s.span_id: s for s in stack.spans()}
        batch = by_span[batch_id]
        assert batch.name == "ragline.retrieve.batch" and batch.parent_id is None
        assert batch.trace_id != root.trace_id
        assert enqueue.span_id in batch.linked_to()
        batch_sizes.append(batch.attributes["ragline.batch.size"])
        in_batch = [s for s in by_span.values() if s.parent_id == batch.span_id]
        assert {s.name for s in in_batch} == {"ragline.retrieve.embed", "ragline.retrieve.search"}
    assert max(batch_sizes) > 1, f"no request was coalesced with another: {batch_sizes}"


def test_a_job_is_traced_from_its_request_to_its_worker(stack: Traced) -> None:
    with httpx.Client(base_url=stack.stack.base, timeout=60) as client:
        reply = client.post(
            "/v1/jobs", json={"query": _unique("Where is Café Lumière?"), "mode": "retrieval"}
        )
    assert reply.status_code == 202, reply.text
    request_id = reply.headers["x-request-id"]
    spans = stack.trace_of(request_id, wanted={"ragline.enqueue", "ragline.retrieve"})
    root = assert_one_tree(spans, request_id)
    assert root.name == "POST /v1/jobs"
    assert only(spans, "ragline.retrieve").attributes["ragline.request_id"] == reply.json()["job_id"]


@pytest.mark.vllm
def test_a_rag_answer_is_traced_through_both_queues(stack: Traced, generation: Proc) -> None:
    bodies = [{"query": _unique("What is the house speciality of Café Lumière?")}]
    request_ids = _ask_concurrently(stack.stack.base, bodies, _stream)
    bodies = [{"query": _unique("Are dogs welcome at Café Lumière?")}]
    request_ids += _ask_concurrently(stack.stack.base, bodies, _json)
    for request_id in request_ids:
        spans = stack.trace_of(request_id, wanted=API_STEPS | {"ragline.retrieve"} | RAG_SPANS)
        assert_one_tree(spans, request_id)
        assert {s.service for s in spans} == {"ragline-api", "ragline-retrieval", "ragline-generation"}
        retrieve, waited = only(spans, "ragline.retrieve"), only(spans, "ragline.generation.queue_wait")
        generate = only(spans, "ragline.generate")
        assert waited.parent_id == generate.parent_id == retrieve.span_id
        assert waited.end == generate.start  # the wait ends where the task begins
        prefill, decode = only(spans, "ragline.generate.prefill"), only(spans, "ragline.generate.decode")
        assert prefill.parent_id == decode.parent_id == generate.span_id
        assert prefill.end == decode.start
        assert decode.attributes["gen_ai.usage.output_tokens"] > 0
