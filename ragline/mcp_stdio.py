"""``ragline mcp``: the MCP server over stdio, for an agent that starts it as a subprocess.

Its tools and resources are the API's own (:mod:`ragline.api.mcp.tools`), answered through the
API's HTTP endpoints with the Python client and an API key: the same door (key, token buckets),
the same pipeline (admission, the key's caps) as any other client of that API. This process
holds no model and no index; it needs only the API's address and a key.

``ask`` reads ``POST /v1/query/stream``, so its progress follows the answer's events; a stream
whose connection drops is resumed where it stopped (the client's own resume).
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import httpx

from ragline.api.mcp.protocol import Progress, Refused
from ragline.api.mcp.tools import build_server
from ragline.client import (
    APIError,
    AsyncClient,
    DoneEvent,
    ErrorEvent,
    QueryResponse,
    RaglineError,
    RestartEvent,
    Source,
    SourcesEvent,
    TokenEvent,
)

log = logging.getLogger(__name__)

# An error event's status as the API names it in a JSON answer (api/pipeline/steps.py: error_of).
_EVENT_ERRORS = {404: "unknown_index", 499: "cancelled", 504: "timeout"}
# What a call to the API may fail with (ValueError: an option the client's request model refuses).
_FAILURES = (Refused, RaglineError, httpx.HTTPError, ValueError)


class ClientBackend:
    """The tools' backend over the API's HTTP endpoints."""

    def __init__(self, client: AsyncClient, *, deadline_ms: int | None = None) -> None:
        self._client = client
        self._deadline_ms = deadline_ms

    async def query(self, body: dict[str, Any], progress: Progress | None) -> QueryResponse:
        options = dict(body)
        query = options.pop("query")
        try:
            if progress is None:
                return await self._client.query(query, deadline_ms=self._deadline_ms, **options)
            return await self._streamed(query, options, progress)
        except _FAILURES as exc:
            raise self._refused(exc) from exc

    async def _streamed(self, query: str, options: dict[str, Any], progress: Progress) -> QueryResponse:
        sources: list[Source] = []
        async for event in self._client.stream(query, deadline_ms=self._deadline_ms, **options):
            if isinstance(event, SourcesEvent):
                sources = event.sources
                await progress.retrieved(len(sources))
            elif isinstance(event, TokenEvent):
                await progress.generated(event.text)
            elif isinstance(event, RestartEvent):
                await progress.restarted()
            elif isinstance(event, ErrorEvent):
                raise Refused(event.status, _EVENT_ERRORS.get(event.status, "failed"), event.message)
            elif isinstance(event, DoneEvent):
                done = event.model_dump(exclude={"event_id"})
                return QueryResponse.model_validate({**done, "sources": sources})
        raise Refused(502, "failed", "the API's stream ended without an answer")

    async def indexes(self) -> dict[str, Any]:
        try:
            return (await self._client.indexes()).model_dump(mode="json")
        except _FAILURES as exc:
            raise self._refused(exc) from exc

    async def index(self, name: str) -> dict[str, Any]:
        try:
            return (await self._client.index(name)).model_dump(mode="json")
        except _FAILURES as exc:
            raise self._refused(exc) from exc

    def _refused(self, exc: Exception) -> Refused:
        if isinstance(exc, Refused):
            return exc
        if isinstance(exc, APIError):
            return Refused(exc.status, exc.error, exc.message, retry_after_s=exc.retry_after)
        if isinstance(exc, ValueError):  # an option the client's request model refuses
            return Refused(422, "invalid_request", str(exc))
        # No answer at all: the connection failed, or a dropped stream could not be resumed.
        return Refused(503, "unavailable", f"the API at {self._client.base_url} did not answer: {exc}")


def serve(url: str, api_key: str | None, *, deadline_ms: int | None = None) -> None:
    """Serve MCP on stdin/stdout until the agent closes them; logs go to stderr."""

    async def run() -> None:
        async with AsyncClient(url, api_key=api_key) as client:
            backend = ClientBackend(client, deadline_ms=deadline_ms)
            server = build_server(lambda: backend)
            log.info("MCP over stdio for the API at %s", url)
            await server.run_stdio_async()

    anyio.run(run)
