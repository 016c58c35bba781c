"""``ragline mcp``: the MCP server over stdio, started by the MCP SDK's own client as an agent
starts it, answering through a real API and workers (and that API's door: its keys)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from ragline.broker.config.settings import Settings

from tests.helpers import Api, api_key, env_for

CHECKOUT = Path(__file__).resolve().parents[2]
QUESTION = "When does Café Lumière open?"


def _over_stdio(settings: Settings, base: str, use: Callable[[Client], Awaitable[Any]], key: str = "") -> Any:
    env = env_for(settings) | {"RAGLINE_API_KEY": key}
    # Run from the checkout, as the tests' other `ragline` processes are: its own code answers.
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "ragline", "mcp", "--url", base], env=env, cwd=str(CHECKOUT)
    )

    async def run() -> Any:
        async with Client(server, read_timeout_seconds=240) as client:
            return await use(client)

    return asyncio.run(run())


@pytest.mark.vllm
def test_ragline_mcp_searches_and_asks_over_stdio(api: Api, workers: Any, settings: Settings) -> None:
    reports: list[str | None] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        reports.append(message)

    async def use(client: Client) -> tuple[Any, ...]:
        found = await client.call_tool("search", {"query": QUESTION, "top_k": 2})
        asked = await client.call_tool("ask", {"query": QUESTION, "top_k": 2}, progress_callback=progress)
        every = await client.read_resource("ragline://indexes")
        return found, asked, every

    found, asked, every = _over_stdio(settings, api.base, use)
    assert not found.is_error, found.content
    assert found.structured_content["passages"][0]["source"].endswith("cafe.md")
    assert not asked.is_error, asked.content
    assert asked.structured_content["answer"] and asked.structured_content["sources"][0]["n"] == 1
    assert reports[0] == "retrieved 2 passages; generating the answer" and len(reports) >= 2
    assert settings.retrieval.default_index in [
        i["name"] for i in json.loads(every.contents[0].text)["indexes"]
    ]


def test_ragline_mcp_goes_through_the_apis_door(auth_apis: list[Api], settings: Settings) -> None:
    async def use(client: Client) -> tuple[Any, ...]:
        tools = await client.list_tools()
        searched = await client.call_tool("search", {"query": QUESTION})
        return tools, searched

    tools, refused = _over_stdio(settings, auth_apis[0].base, use)
    assert {t.name for t in tools.tools} == {"search", "ask"}  # this process answers that itself
    assert refused.is_error and "401 unauthenticated: an API key is required" in refused.content[0].text

    async def indexes(client: Client) -> Any:
        return await client.read_resource("ragline://indexes")

    listed = _over_stdio(settings, auth_apis[0].base, indexes, key=api_key(settings)[0])
    assert "default_index" in json.loads(listed.contents[0].text)


@pytest.mark.unit
def test_ragline_mcp_is_a_command() -> None:
    from ragline.cli import build_parser

    args = build_parser().parse_args(["mcp", "--url", "http://api:8000", "--deadline-ms", "5000"])
    assert (args.url, args.deadline_ms) == ("http://api:8000", 5000)
    assert args.api_key == os.environ.get("RAGLINE_API_KEY")
