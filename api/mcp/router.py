"""``/mcp``: the MCP server over streamable HTTP, on the API, behind the same door as every route.

The route sits among the API's own, so its requests pass the same middleware (request id, body
limit, API key and token buckets: 401 and 429 before any MCP message is read, as JSON-RPC errors
an MCP client shows: :mod:`ragline.api.errors`) and each tool call runs the query pipeline with
the caller's key (:mod:`ragline.api.mcp.service`).

Stateless: every POST is answered on its own, with no session kept in this process, so any API
process behind a load balancer can take any call (a session would pin a client to the process
that opened it). A tool's progress notifications go out on its own POST's response, which is a
stream while the tool runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

from fastapi import APIRouter, FastAPI
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from ragline.api.errors import MCP_PATH
from ragline.api.mcp.protocol import Backend
from ragline.api.mcp.service import PipelineBackend
from ragline.api.mcp.tools import build_server
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

PATH = MCP_PATH

# The HTTP request that carried the MCP message being handled (bound around each handler).
_carrier: ContextVar[Request | None] = ContextVar("ragline_mcp_request", default=None)


async def _bind_request(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """Make the HTTP request that carried this message the one its handler answers for."""
    token = _carrier.set(ctx.request if isinstance(ctx.request, Request) else None)
    try:
        return await call_next(ctx)
    finally:
        _carrier.reset(token)


def _backend() -> Backend:
    request = _carrier.get()
    if request is None:  # the transport always attaches it; a message without one has no caller
        raise RuntimeError("an MCP message reached /mcp's handlers without its HTTP request")
    return PipelineBackend(request)


class _Endpoint:
    """The ASGI app of the route: the SDK's transport (its lifespan runs the manager)."""

    def __init__(self, manager: StreamableHTTPSessionManager) -> None:
        self._manager = manager

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._manager.handle_request(scope, receive, send)


def router() -> APIRouter:
    """A new ``/mcp`` route and the lifespan that runs its transport (one per app: the SDK's
    manager runs once)."""
    server = build_server(_backend, middleware=[_bind_request])
    # Host checks are the API's own (every route's, not only this one's); and no key, no call.
    server.streamable_http_app(
        streamable_http_path=PATH,
        stateless_http=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    manager = server.session_manager

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with manager.run():
            yield

    mcp = APIRouter(lifespan=lifespan)
    mcp.routes.append(
        Route(PATH, _Endpoint(manager), methods=["GET", "POST", "DELETE"], include_in_schema=False)
    )
    return mcp
