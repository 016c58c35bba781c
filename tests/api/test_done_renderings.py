"""A field added to Done reaches every rendering of an answer with that one edit: the JSON answer,
the SSE `done`, a job's result, its webhook's body, and the OpenAI extension of a completion and
of a stream's last chunk.

The edit is played by a model built on Done with one more field; each renderer is run on an
answer of that model. tests/api/test_done_contract.py checks Done's own fields through real
workers.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pydantic import Field, create_model
from ragline.api.chat.render import ChunkStream, completion_of
from ragline.api.pipeline import QueryContext
from ragline.api.query.protocol import QueryResponse
from ragline.api.query.render import json_answer, sse_events
from ragline.broker.config.settings import ApiSettings
from ragline.broker.contract.messages import Citation, Done, Source, Sources, Timings, Token, Usage
from ragline.broker.contract.records import JobQuery, JobRecord, JobView
from ragline.broker.streams.events import Event

SOURCE = Source(chunk_id="c1", source="cafe.md", title="Café", text="Opens at 7:15.", score=0.9)
# Done with a field it does not have today: what one edit to Done would make of it.
Flavoured = create_model(
    "Flavoured", __base__=Done, flavour=(str, Field(default="plain", description="A new field of Done."))
)
ANSWER = Flavoured(
    answer="At 7:15 [1].",
    flavour="mint",
    usage=Usage(prompt_tokens=10, completion_tokens=4),
    timings=Timings(retrieval_ms=2.0, generation_ms=3.0),
    sources_dropped=1,
    citations=[Citation(marker=1, chunk_id="c1", source="cafe.md", title="Café")],
    finish_reason="stop",
    partial=True,
    partial_shards=["docs.shard-1"],
)
EVENTS = [
    Event("1700000000000-0", Sources(sources=[SOURCE], index="docs")),
    Event("1700000000000-1", Token(text="At 7:15 [1].")),
    Event("1700000000000-2", ANSWER),
]
# The OpenAI extension leaves these to OpenAI's own fields (message.content, usage, finish_reason).
IN_OPENAI_FIELDS = {"answer", "usage", "finish_reason"}


class _Pipeline:
    """What the JSON and SSE renderers ask of the pipeline once it has run: the request's events."""

    settings = ApiSettings()

    async def start(self, ctx: QueryContext[Any]) -> None:
        return None

    async def relay(self, ctx: QueryContext[Any], *, after: str = "0-0") -> AsyncIterator[Event]:
        for event in EVENTS:
            yield event

    def cancel_soon(self, request_id: str) -> None:
        return None


def _ctx() -> QueryContext[Any]:
    return QueryContext("r1", request=None, query=None, deadline_s=1.0, source_id="r1")


def json_rendering() -> dict[str, Any]:
    return json.loads(asyncio.run(json_answer(_Pipeline(), _ctx())))  # type: ignore[arg-type]


def sse_rendering() -> dict[str, Any]:
    async def frames() -> list[bytes]:
        return [f async for f in sse_events(_Pipeline(), _ctx())]  # type: ignore[arg-type]

    last = asyncio.run(frames())[-1].decode().strip().split("\n")
    assert "event: done" in last, last
    return json.loads(last[-1].removeprefix("data: "))


def _job() -> JobView:
    now = time.time()
    record = JobRecord(
        id="j1",
        owner="alice",
        status="done",
        created_at=now - 2,
        updated_at=now,
        done_at=now,
        request=JobQuery(query="When?", top_k=3, index="docs"),
        sources=[SOURCE],
        result=ANSWER,
        webhook_url="https://hooks.example.com/in",
        delivery_id="d1",
    )
    return JobView.of(record)


def job_rendering() -> dict[str, Any]:
    return _job().model_dump(mode="json")["result"]


def webhook_rendering() -> dict[str, Any]:
    return json.loads(_job().webhook_body())["result"]


def openai_completion_rendering() -> dict[str, Any]:
    response = QueryResponse.from_done(ANSWER, request_id="r1", sources=[SOURCE])
    return json.loads(completion_of(response, model="docs", created=1).model_dump_json())["ragline"]


def openai_stream_rendering() -> dict[str, Any]:
    chunks = ChunkStream("r1", model="docs")
    last = [data for event in EVENTS if (data := chunks.feed(event)) is not None][-1]
    return json.loads(last)["ragline"]


RENDERERS: dict[str, Callable[[], dict[str, Any]]] = {
    "json": json_rendering,
    "sse done": sse_rendering,
    "job result": job_rendering,
    "webhook body": webhook_rendering,
    "openai completion": openai_completion_rendering,
    "openai stream": openai_stream_rendering,
}


@pytest.mark.parametrize("render", RENDERERS.values(), ids=RENDERERS.keys())
def test_every_rendering_carries_a_field_added_to_done(render: Callable[[], dict[str, Any]]) -> None:
    rendered = render()
    assert rendered["flavour"] == "mint"
    expected = json.loads(ANSWER.encode())
    # Every other field of the answer too, as the worker wrote it (a job's total is its own).
    for name in Done.model_fields.keys() - {"timings"}:
        if name in rendered:
            assert rendered[name] == expected[name], name
    assert rendered["timings"]["generation_ms"] == 3.0 and rendered["partial_shards"] == ["docs.shard-1"]


@pytest.mark.parametrize(
    "render",
    [RENDERERS["openai completion"], RENDERERS["openai stream"]],
    ids=["completion", "stream"],
)
def test_the_openai_extension_is_the_done_but_what_openai_s_own_fields_carry(
    render: Callable[[], dict[str, Any]],
) -> None:
    rendered = render()
    # A stream's chunks leave out what is null.
    present = {name for name in Done.model_fields if getattr(ANSWER, name) is not None}
    assert rendered.keys() >= present - IN_OPENAI_FIELDS
    assert not rendered.keys() & IN_OPENAI_FIELDS
    assert rendered["request_id"] == "r1" and rendered["partial"] is True


@pytest.mark.parametrize("render", [r for n, r in RENDERERS.items() if "openai" not in n])
def test_the_other_renderings_carry_every_done_field(render: Callable[[], dict[str, Any]]) -> None:
    assert render().keys() >= Done.model_fields.keys() | {"flavour"}
