"""/mcp on a real API process with real workers, through the MCP SDK's own client over streamable
HTTP: the tools answer from the session's index, ask reports progress, the indexes are resources,
and the door and admission treat an MCP call as they treat /v1/query."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from ragline.broker.config.settings import Settings

from tests.helpers import Api, api_key, planted_load, pushed_queues

QUESTION = "When does Café Lumière open?"


def _session(base: str, use: Callable[[Client], Awaitable[Any]], *, key: str | None = None) -> Any:
    """``use`` a client of ``base``/mcp, sending ``key`` as the API key."""

    async def run() -> Any:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        timeout = httpx2.Timeout(30, read=240)
        async with (
            httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
            Client(streamable_http_client(base + "/mcp", http_client=http)) as client,
        ):
            return await use(client)

    return asyncio.run(run())


def _first_error(exc: BaseException) -> BaseException:
    """The error under the task groups' ExceptionGroups that a client's start raises through."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


@pytest.mark.vllm
def test_search_ask_and_the_indexes_over_streamable_http(api: Api, workers: Any, test_index: str) -> None:
    reports: list[tuple[float, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        reports.append((value, message))

    async def use(client: Client) -> tuple[Any, ...]:
        tools = await client.list_tools()
        found = await client.call_tool("search", {"query": QUESTION, "top_k": 2, "index": test_index})
        asked = await client.call_tool("ask", {"query": QUESTION, "top_k": 2}, progress_callback=progress)
        every = await client.read_resource("ragline://indexes")
        one = await client.read_resource(f"ragline://indexes/{test_index}")
        unknown = await client.call_tool("search", {"query": QUESTION, "index": "no-such-index"})
        return tools, found, asked, every, one, unknown

    tools, found, asked, every, one, unknown = _session(api.base, use)
    assert {t.name for t in tools.tools} == {"search", "ask"}

    assert not found.is_error, found.content
    passages = found.structured_content["passages"]
    assert len(passages) == 2 and passages[0]["n"] == 1
    assert passages[0]["source"].endswith("cafe.md") and passages[0]["title"] == "Café Lumière"
    assert isinstance(passages[0]["score"], float) and "7:15" in passages[0]["text"]
    assert found.content[0].text.startswith("[1] Café Lumière (")

    assert not asked.is_error, asked.content
    body = asked.structured_content
    assert body["answer"] and body["degraded"] is False and body["finish_reason"] in ("stop", "length")
    assert body["sources"][0]["source"].endswith("cafe.md")
    assert set(body["cited"]) <= {s["n"] for s in body["sources"]}
    assert "\n\nSources:\n[1] Café Lumière (" in asked.content[0].text
    # Progress while it generated: first the retrieval, then the answer's text as it came.
    assert len(reports) >= 2 and [v for v, _ in reports] == sorted({v for v, _ in reports})
    assert reports[0][1] == "retrieved 2 passages; generating the answer"
    assert (reports[-1][1] or "").startswith("generating the answer: ")

    listed = json.loads(every.contents[0].text)
    assert test_index in [i["name"] for i in listed["indexes"]]
    assert json.loads(one.contents[0].text)["name"] == test_index
    assert unknown.is_error and "404 unknown_index" in unknown.content[0].text


def test_the_door_takes_keys_and_spends_tokens_for_mcp_calls(
    auth_apis: list[Api], settings: Settings
) -> None:
    base = auth_apis[0].base

    async def list_tools(client: Client) -> Any:
        return await client.list_tools()

    with pytest.raises(BaseException) as refused:
        _session(base, list_tools)
    error = _first_error(refused.value)
    assert isinstance(error, MCPError) and error.error.message.startswith(
        "401 unauthenticated: an API key is required"
    )

    assert {t.name for t in _session(base, list_tools, key=api_key(settings)[0]).tools} == {"search", "ask"}

    # A key's bucket counts each HTTP request: the client's start, then every call, until it is
    # empty. (An empty query is refused by the pipeline, as a tool error: no queue is touched.)
    stingy = api_key(settings, rate=0.01, burst=4)[0]

    async def until_refused(client: Client) -> MCPError:
        for _ in range(10):
            try:
                result = await client.call_tool("search", {"query": ""})
            except MCPError as exc:
                return exc
            assert result.is_error and "422" in result.content[0].text
        raise AssertionError("ten calls past a burst of 4 were all served")

    limited = _session(base, until_refused, key=stingy)
    assert limited.error.message.startswith("429 rate_limited: over this API key's rate limit")


@pytest.mark.vllm
def test_busy_generation_degrades_an_ask_as_it_does_a_query(
    auth_apis: list[Api], workers: Any, settings: Settings
) -> None:
    key = api_key(settings)[0]

    async def ask(client: Client) -> Any:
        return await client.call_tool("ask", {"query": QUESTION + " (mcp, degraded)", "top_k": 2})

    with planted_load(settings, "generation"), pushed_queues(settings.redis.redis_url) as pushed:
        degraded = _session(auth_apis[0].base, ask, key=key)
    assert not degraded.is_error, degraded.content
    body = degraded.structured_content
    assert body["degraded"] is True and body["answer"] is None and "Generation is busy" in body["notice"]
    assert body["sources"][0]["source"].endswith("cafe.md")
    assert degraded.content[0].text.startswith(body["notice"])
    assert "retrieval" in pushed and "generation" not in pushed
