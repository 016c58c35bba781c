"""The MCP server: tools ``search`` and ``ask``, resources for the indexes, over any backend.

The same server answers on the API (``/mcp``, streamable HTTP: :mod:`ragline.api.mcp.router`) and
over stdio (``ragline mcp``: :mod:`ragline.mcp_stdio`); only the backend differs, and each takes
the request through the API's own door and query pipeline (:mod:`ragline.api.mcp.protocol`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any, Literal

from mcp.server.context import ServerMiddleware
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field
from ragline.api.mcp.protocol import (
    AskResult,
    Backend,
    Filter,
    Refused,
    Retrieval,
    SearchResult,
    ask_result,
    ask_text,
    search_result,
    search_text,
)

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "ragline answers from the documents ingested into its indexes. `search` returns the passages "
    "that match a query, best first, with their titles, files and scores; `ask` returns an answer "
    "grounded in those passages, citing them as [n]. The resource ragline://indexes lists the "
    "indexes (the default one is used when a call names none)."
)
INDEXES_URI = "ragline://indexes"
INDEX_URI = "ragline://indexes/{name}"

Query = Annotated[str, Field(description="The question or search text.")]
Index = Annotated[
    str | None,
    Field(description="The index to ask (ragline://indexes lists them); the default when omitted."),
]
TopK = Annotated[
    int | None, Field(description="How many passages, 1 to 50; the server's default when omitted.")
]
FilterArg = Annotated[
    Filter | None,
    Field(
        description='Metadata every passage must match: key -> a value, a list of values, or {"prefix": …}. '
        "Keys: `path` (the file under what was ingested), `title`, and the index's own metadata keys."
    ),
]
RetrievalArg = Annotated[
    Retrieval | None,
    Field(
        description="`dense` (embeddings), `lexical` (BM25) or `hybrid` (both); "
        "the server's default when omitted."
    ),
]
_READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)


@contextlib.contextmanager
def _root_logging_left_alone() -> Iterator[None]:
    """MCPServer's constructor calls ``logging.basicConfig``, which would give a process whose root
    logger has no handler yet (the API under uvicorn) the SDK's handler and level: a root handler
    held for the moment makes that call do nothing."""
    root = logging.getLogger()
    placeholder = logging.NullHandler()
    root.addHandler(placeholder)
    try:
        yield
    finally:
        root.removeHandler(placeholder)


def _request(query: str, mode: Literal["rag", "retrieval"], **options: Any) -> dict[str, Any]:
    """``POST /v1/query``'s body: the options given, the server's defaults for the rest."""
    body: dict[str, Any] = {"query": query, "mode": mode}
    for name, value in options.items():
        if value is None:
            continue
        if name == "filter":
            value = {k: v.model_dump() if isinstance(v, BaseModel) else v for k, v in value.items()}
        body[name] = value
    return body


def _result(text: str, structured: BaseModel) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=structured.model_dump(mode="json")
    )


class _Reporter:
    """An answer's progress as MCP progress notifications: a step per event, so the value always
    increases, with a message saying what happened. Best effort: a notification that cannot be
    sent does not fail the answer."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._step = 0
        self._chars = 0

    async def _report(self, message: str) -> None:
        self._step += 1
        try:
            await self._ctx.report_progress(self._step, None, message)
        except Exception:
            log.debug("a progress notification was not sent", exc_info=True)

    async def retrieved(self, sources: int) -> None:
        await self._report(f"retrieved {sources} passages; generating the answer")

    async def generated(self, text: str) -> None:
        self._chars += len(text)
        await self._report(f"generating the answer: {self._chars} characters so far")

    async def restarted(self) -> None:
        self._chars = 0
        await self._report("a worker stopped mid-answer; another is generating it again")


def build_server(
    backend: Callable[[], Backend], *, middleware: Sequence[ServerMiddleware[Any]] = ()
) -> MCPServer:
    """The MCP server whose tools and resources ask ``backend()``, the backend of the call at hand."""
    with _root_logging_left_alone():
        server: MCPServer = MCPServer(
            "ragline", instructions=INSTRUCTIONS, version="0.1.0", middleware=list(middleware)
        )

    @server.tool(
        title="Search the documents",
        description="The passages of an index that best match a query, best first: each with its "
        "number, title, file, anchor, score and text. No answer is generated.",
        annotations=_READ_ONLY,
    )
    async def search(
        query: Query,
        index: Index = None,
        top_k: TopK = None,
        filter: FilterArg = None,
        retrieval: RetrievalArg = None,
    ) -> Annotated[CallToolResult, SearchResult]:
        body = _request(query, "retrieval", index=index, top_k=top_k, filter=filter, retrieval=retrieval)
        try:
            answer = await backend().query(body, None)
        except Refused as exc:
            raise ToolError(str(exc)) from None
        result = search_result(answer)
        return _result(search_text(result), result)

    @server.tool(
        title="Ask the documents",
        description="An answer to a question, grounded in the passages retrieved for it and citing them "
        "as [n] (the numbers of `sources`). Sends progress notifications while it generates. When "
        "generation is too busy it answers with the passages only (`degraded`, with a `notice`).",
        annotations=_READ_ONLY,
    )
    async def ask(
        ctx: Context,
        query: Query,
        index: Index = None,
        top_k: TopK = None,
        filter: FilterArg = None,
    ) -> Annotated[CallToolResult, AskResult]:
        body = _request(query, "rag", index=index, top_k=top_k, filter=filter)
        try:
            answer = await backend().query(body, _Reporter(ctx))
        except Refused as exc:
            raise ToolError(str(exc)) from None
        result = ask_result(answer)
        return _result(ask_text(result), result)

    @server.resource(
        INDEXES_URI,
        name="indexes",
        title="The indexes",
        description="Every index: its name, version, document and chunk counts, type, and which one "
        "is the default (GET /v1/indexes).",
        mime_type="application/json",
    )
    async def indexes() -> str:
        try:
            return json.dumps(await backend().indexes())
        except Refused as exc:
            raise ResourceError(str(exc)) from None

    @server.resource(
        INDEX_URI,
        name="index",
        title="One index",
        description="One index's current version: documents, chunks, bytes on disk, embedding "
        "dimensions, type (GET /v1/indexes/{name}).",
        mime_type="application/json",
    )
    async def index(name: str) -> str:
        try:
            return json.dumps(await backend().index(name))
        except Refused as exc:
            if exc.status == 404:
                raise ResourceNotFoundError(str(exc)) from None
            raise ResourceError(str(exc)) from None

    return server
