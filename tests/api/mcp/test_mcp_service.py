"""The /mcp backend over a narrow fake of the query pipeline: what it gives the pipeline from the
HTTP request that carried the call, how events become progress and an answer, and when it flags
a generation cancelled. Through real parts (the door, admission, workers): test_mcp_stack.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from ragline.api.errors import ApiError
from ragline.api.mcp.protocol import Refused
from ragline.api.mcp.service import PipelineBackend
from ragline.api.query.protocol import QueryRequest, QueryResponse
from ragline.broker.contract.messages import Done, Error, Restart, Source, Sources, Token
from ragline.broker.streams.events import Event
from starlette.requests import Request

CAFE = Source(chunk_id="c1", source="cafe.md", title="Café", text="Opens at 7:15.", score=0.9)
EVENTS = [
    Event("1-0", Sources(sources=[CAFE])),
    Event("1-1", Token(text="At ")),
    Event("1-2", Restart()),
    Event("1-3", Token(text="At 7:15 [1].")),
    Event("1-4", Done(answer="At 7:15 [1].", finish_reason="stop")),
]


class FakePipeline:
    def __init__(self, events: list[Event], *, cached: bytes | None = None, refusal: ApiError | None = None):
        self.events = events
        self.cached = cached
        self.refusal = refusal
        self.contexts: list[dict[str, Any]] = []
        self.cancelled: list[str] = []

    def context(self, request: QueryRequest, **given: Any) -> SimpleNamespace:
        if self.refusal is not None:
            raise self.refusal
        self.contexts.append({"request": request, **given})
        return SimpleNamespace(request_id=given["request_id"], cached=None, answered_as=request.mode)

    async def start(self, ctx: SimpleNamespace) -> None:
        ctx.cached = self.cached

    def cached_json(self, ctx: SimpleNamespace) -> bytes:
        assert self.cached is not None
        return b'{"request_id":"' + ctx.request_id.encode() + b'",' + self.cached[1:]

    async def relay(self, ctx: SimpleNamespace, *, after: str = "0-0") -> AsyncIterator[Event]:
        for event in self.events:
            yield event

    def cancel_soon(self, request_id: str) -> None:
        self.cancelled.append(request_id)


class Told:
    """A progress that records what it is told; ``stop_at``: the call is given up at that event."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.told: list[str] = []
        self.stop_at = stop_at

    async def _tell(self, what: str) -> None:
        self.told.append(what)
        if len(self.told) == self.stop_at:
            raise asyncio.CancelledError

    async def retrieved(self, sources: int) -> None:
        await self._tell(f"retrieved {sources}")

    async def generated(self, text: str) -> None:
        await self._tell(f"text {text}")

    async def restarted(self) -> None:
        await self._tell("restart")


def _request(pipeline: FakePipeline) -> Request:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "headers": [(b"x-request-deadline-ms", b"5000")],
        "app": SimpleNamespace(state=SimpleNamespace(pipeline=pipeline)),
        "state": {"request_id": "req1", "principal": "key_1"},
    }
    return Request(scope)


@pytest.mark.unit
def test_search_runs_the_pipeline_as_the_json_answer_does_with_the_callers_request() -> None:
    pipeline = FakePipeline([EVENTS[0], Event("1-1", Done(answer=None))])
    request = _request(pipeline)
    answer = asyncio.run(PipelineBackend(request).query({"query": "When?", "mode": "retrieval"}, None))
    assert isinstance(answer, QueryResponse)
    assert answer.request_id == "req1" and answer.sources == [CAFE] and answer.answer is None
    [given] = pipeline.contexts
    assert given["request"] == QueryRequest(query="When?", mode="retrieval")
    assert given["request_id"] == "req1" and given["principal"] == "key_1"
    assert given["deadline_ms"] == "5000" and given["single_flight"] is True
    assert request.state.answered_as == "retrieval"  # the request-latency metric's label
    assert pipeline.cancelled == []


@pytest.mark.unit
def test_ask_tells_each_event_and_answers_from_its_own_stream() -> None:
    pipeline, told = FakePipeline(EVENTS), Told()
    answer = asyncio.run(PipelineBackend(_request(pipeline)).query({"query": "When?"}, told))
    assert told.told == ["retrieved 1", "text At ", "restart", "text At 7:15 [1]."]
    assert answer.answer == "At 7:15 [1]." and answer.sources == [CAFE] and answer.request_id == "req1"
    assert pipeline.contexts[0]["single_flight"] is False  # its own stream, so it can be cancelled
    assert pipeline.cancelled == []


@pytest.mark.unit
def test_an_ask_given_up_before_its_answer_cancels_the_generation() -> None:
    pipeline = FakePipeline(EVENTS)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(PipelineBackend(_request(pipeline)).query({"query": "When?"}, Told(stop_at=2)))
    assert pipeline.cancelled == ["req1"]


@pytest.mark.unit
def test_an_error_event_is_refused_with_its_status() -> None:
    pipeline = FakePipeline([EVENTS[0], Event("1-1", Error(status=504, message="no answer in time"))])
    with pytest.raises(Refused) as refused:
        asyncio.run(PipelineBackend(_request(pipeline)).query({"query": "When?"}, Told()))
    assert (refused.value.status, refused.value.error) == (504, "timeout")
    assert pipeline.cancelled == []  # it ended: nothing left to cancel


@pytest.mark.unit
def test_the_pipelines_refusals_keep_their_status_and_retry_after() -> None:
    overloaded = ApiError(503, "overloaded", "too busy", headers={"Retry-After": "2"})
    with pytest.raises(Refused) as refused:
        asyncio.run(
            PipelineBackend(_request(FakePipeline([], refusal=overloaded))).query({"query": "x"}, None)
        )
    assert str(refused.value) == "503 overloaded: too busy (retry in 2 s)"
    with pytest.raises(Refused) as invalid:
        asyncio.run(PipelineBackend(_request(FakePipeline([]))).query({"query": "x", "top_k": "2"}, None))
    assert invalid.value.status == 422 and "top_k" in invalid.value.message


@pytest.mark.unit
def test_a_cached_answer_is_told_as_retrieved_and_answered_whole() -> None:
    cached = QueryResponse(request_id="", answer="At 7:15 [1].", sources=[CAFE], cached=True)
    body = cached.model_dump_json(exclude={"request_id"}).encode()
    pipeline, told = FakePipeline([], cached=body), Told()
    answer = asyncio.run(PipelineBackend(_request(pipeline)).query({"query": "When?"}, told))
    assert answer.cached is True and answer.request_id == "req1" and answer.answer == "At 7:15 [1]."
    assert told.told == ["retrieved 1"]
