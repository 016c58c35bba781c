"""The MCP tools and resources, through the SDK's own client connected in process, over a narrow
fake backend: what each sends the API, what the agent gets back, progress, and refusals.

The backends on the real API (/mcp, stdio) are tested through a real stack in test_mcp_stack.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from ragline.api.mcp.protocol import Progress, Refused
from ragline.api.mcp.tools import build_server
from ragline.api.query.protocol import QueryResponse
from ragline.broker.contract.messages import Citation, Source

CAFE = Source(
    chunk_id="c1", source="cafe.md", title="Café Lumière", text="Opens at 7:15.", score=0.91, anchor="hours"
)
TEA = Source(chunk_id="c2", source="tea.md", title="Green tea", text="Steep two minutes.", score=0.42)


def _answer(**fields: Any) -> QueryResponse:
    base: dict[str, Any] = {
        "request_id": "r1",
        "answer": "It opens at 7:15 [1].",
        "sources": [CAFE, TEA],
        "citations": [Citation(marker=1, chunk_id="c1", source="cafe.md", title="Café Lumière")],
        "finish_reason": "stop",
    }
    return QueryResponse(**(base | fields))


class FakeBackend:
    def __init__(self, answer: QueryResponse | None = None, refusal: Refused | None = None) -> None:
        self.answer = answer or _answer()
        self.refusal = refusal
        self.bodies: list[dict[str, Any]] = []

    async def query(self, body: dict[str, Any], progress: Progress | None) -> QueryResponse:
        self.bodies.append(body)
        if self.refusal is not None:
            raise self.refusal
        if progress is not None:
            await progress.retrieved(2)
            await progress.generated("It opens ")
            await progress.restarted()
            await progress.generated("It opens at 7:15 [1].")
        return self.answer

    async def indexes(self) -> dict[str, Any]:
        return {"indexes": [{"name": "docs", "version": "v1"}], "default_index": "docs"}

    async def index(self, name: str) -> dict[str, Any]:
        if name != "docs":
            raise Refused(404, "unknown_index", f"index {name!r} does not exist; ingest it first")
        return {"name": "docs", "version": "v1", "chunks": 2}


def _with_client(backend: FakeBackend, use: Callable[[Client], Awaitable[Any]]) -> Any:
    async def run() -> Any:
        async with Client(build_server(lambda: backend)) as client:
            return await use(client)

    return asyncio.run(run())


@pytest.mark.unit
def test_tools_are_listed_read_only_with_their_arguments_and_results() -> None:
    tools = {t.name: t for t in _with_client(FakeBackend(), lambda c: c.list_tools()).tools}
    assert set(tools) == {"search", "ask"}
    assert set(tools["search"].input_schema["properties"]) == {
        "query",
        "index",
        "top_k",
        "filter",
        "retrieval",
    }
    assert set(tools["ask"].input_schema["properties"]) == {"query", "index", "top_k", "filter"}
    assert tools["search"].input_schema["required"] == ["query"]
    assert tools["ask"].annotations is not None and tools["ask"].annotations.read_only_hint
    assert tools["search"].output_schema is not None
    assert "passages" in tools["search"].output_schema["properties"]
    assert {"answer", "cited", "sources", "degraded"} <= set(tools["ask"].output_schema["properties"])


@pytest.mark.unit
def test_search_asks_for_retrieval_only_and_numbers_the_passages() -> None:
    backend = FakeBackend(_answer(answer=None, citations=[], finish_reason=None))
    arguments = {"query": "opening hours", "index": "docs", "top_k": 2, "filter": {"path": {"prefix": "ca"}}}
    result = _with_client(backend, lambda c: c.call_tool("search", arguments))
    assert not result.is_error
    # Only what was given travels: the API's defaults for the rest.
    assert backend.bodies == [
        {
            "query": "opening hours",
            "mode": "retrieval",
            "index": "docs",
            "top_k": 2,
            "filter": {"path": {"prefix": "ca"}},
        }
    ]
    passages = result.structured_content["passages"]
    assert [(p["n"], p["title"], p["source"], p["anchor"], p["score"]) for p in passages] == [
        (1, "Café Lumière", "cafe.md", "hours", 0.91),
        (2, "Green tea", "tea.md", "", 0.42),
    ]
    text = result.content[0].text
    assert text.startswith("[1] Café Lumière (cafe.md#hours, score 0.910)\nOpens at 7:15.")
    assert "[2] Green tea (tea.md, score 0.420)" in text


@pytest.mark.unit
def test_ask_reports_progress_and_answers_with_its_numbered_sources() -> None:
    backend = FakeBackend()
    reports: list[tuple[float, float | None, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        reports.append((value, total, message))

    result = _with_client(
        backend, lambda c: c.call_tool("ask", {"query": "When?"}, progress_callback=progress)
    )
    assert backend.bodies == [{"query": "When?", "mode": "rag"}]
    values = [value for value, _, _ in reports]
    assert values == sorted(set(values)) and len(values) == 4  # one step per event, always increasing
    assert reports[0][2] == "retrieved 2 passages; generating the answer"
    assert reports[1][2] == "generating the answer: 9 characters so far"
    assert "again" in (reports[2][2] or "")
    assert reports[3][2] == "generating the answer: 21 characters so far"  # counted anew after a restart
    body = result.structured_content
    assert body["answer"] == "It opens at 7:15 [1]." and body["cited"] == [1]
    assert [s["n"] for s in body["sources"]] == [1, 2] and body["sources"][0]["source"] == "cafe.md"
    assert body["degraded"] is False and body["request_id"] == "r1"
    assert result.content[0].text == (
        "It opens at 7:15 [1].\n\nSources:\n[1] Café Lumière (cafe.md#hours)\n[2] Green tea (tea.md)"
    )


@pytest.mark.unit
def test_a_degraded_ask_says_why_and_lists_the_sources() -> None:
    notice = "Generation is busy: these are the retrieved sources."
    backend = FakeBackend(
        _answer(answer=None, citations=[], degraded=True, notice=notice, finish_reason=None)
    )
    result = _with_client(backend, lambda c: c.call_tool("ask", {"query": "When?"}))
    assert not result.is_error
    assert result.structured_content["degraded"] is True and result.structured_content["answer"] is None
    assert result.content[0].text.startswith(notice + "\n\nSources:\n[1] Café Lumière")


@pytest.mark.unit
def test_a_refusal_is_an_error_result_that_says_what_and_when() -> None:
    backend = FakeBackend(refusal=Refused(429, "key_cap", "this key holds 4 requests", retry_after_s=1))
    result = _with_client(backend, lambda c: c.call_tool("ask", {"query": "When?"}))
    assert result.is_error
    assert "429 key_cap: this key holds 4 requests (retry in 1 s)" in result.content[0].text


@pytest.mark.unit
def test_arguments_of_the_wrong_type_are_an_error_result() -> None:
    backend = FakeBackend()
    result = _with_client(backend, lambda c: c.call_tool("search", {"query": "x", "top_k": "many"}))
    assert result.is_error and "top_k" in result.content[0].text
    assert backend.bodies == []


@pytest.mark.unit
def test_the_indexes_are_resources() -> None:
    async def use(client: Client) -> tuple[Any, ...]:
        listed = await client.list_resources()
        templates = await client.list_resource_templates()
        every = await client.read_resource("ragline://indexes")
        one = await client.read_resource("ragline://indexes/docs")
        with pytest.raises(MCPError, match="404 unknown_index: index 'nope' does not exist"):
            await client.read_resource("ragline://indexes/nope")
        return listed, templates, every, one

    listed, templates, every, one = _with_client(FakeBackend(), use)
    assert [str(r.uri) for r in listed.resources] == ["ragline://indexes"]
    assert [t.uri_template for t in templates.resource_templates] == ["ragline://indexes/{name}"]
    assert json.loads(every.contents[0].text)["default_index"] == "docs"
    assert every.contents[0].mime_type == "application/json"
    assert json.loads(one.contents[0].text)["chunks"] == 2


@pytest.mark.unit
def test_building_the_server_leaves_an_unconfigured_root_logger_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As under uvicorn, which configures its own loggers only: the API's logging stays its own.
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", logging.WARNING)
    build_server(lambda: FakeBackend())
    assert root.handlers == [] and root.level == logging.WARNING
