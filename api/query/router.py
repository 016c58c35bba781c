"""POST /v1/query (JSON answer) and POST /v1/query/stream (SSE), plus SSE resume by request id.

Each is a thin adapter: the pipeline's context from the request, the pipeline's steps, a renderer.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response
from ragline.api.deps import (
    DEADLINE,
    opened_stream,
    pipeline_of,
    resumed_stream,
    valid_resume_point,
    validated,
)
from ragline.api.errors import ApiError
from ragline.api.query.protocol import ErrorBody, QueryRequest, QueryResponse, json_body
from ragline.api.query.render import json_answer, sse_answer, sse_events
from ragline.api.sse import EventStream

router = APIRouter(prefix="/v1", tags=["query"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody},
    401: {"model": ErrorBody},
    404: {"model": ErrorBody},
    413: {"model": ErrorBody},
    422: {"model": ErrorBody},
    429: {"model": ErrorBody},
    503: {"model": ErrorBody},
    504: {"model": ErrorBody},
}
_SSE: dict[int | str, dict[str, Any]] = {**_ERRORS, 200: {"content": {"text/event-stream": {}}}}


@router.post("/query", response_model=QueryResponse, responses=_ERRORS, openapi_extra=json_body(QueryRequest))
async def query(request: Request, deadline_ms: str | None = DEADLINE) -> Response:
    """The whole answer as one JSON body.

    Served below the framework by ``api/pipeline/fast_path.py``, which calls these same functions; this
    route documents the endpoint, and tests/api/pipeline/test_fast_path.py holds the two to one behaviour."""
    ctx = await validated(request, QueryRequest, deadline_ms, single_flight=True)
    body = await json_answer(pipeline_of(request), ctx)
    request.state.answered_as = ctx.answered_as
    return Response(body, media_type="application/json")


@router.post("/query/stream", responses=_SSE, openapi_extra=json_body(QueryRequest))
async def query_stream(request: Request, deadline_ms: str | None = DEADLINE) -> EventStream:
    """The answer as server-sent events: ``sources``, ``token``…, then ``done`` (or ``error``).

    Streams skip single flight: a client resumes by its own request id, so it needs its own stream.
    """
    pipeline = pipeline_of(request)
    ctx = await validated(request, QueryRequest, deadline_ms, streamed=True)
    assert ctx.request is not None
    abort = ctx.request.abort_on_disconnect
    return await opened_stream(request, ctx, lambda c: sse_answer(pipeline, c, abort_on_disconnect=abort))


@router.get("/query/stream/{request_id}", responses=_SSE)
async def resume_stream(
    request_id: str, request: Request, last_event_id: str | None = Header(default=None)
) -> EventStream:
    """Reconnect to a request's stream; with ``Last-Event-ID`` only the events after it are sent."""
    after = last_event_id or "0-0"
    if not valid_resume_point(request_id, after):
        raise ApiError(422, "invalid_request", "bad request id or Last-Event-ID")
    pipeline = pipeline_of(request)
    return await resumed_stream(request, request_id, lambda ctx: sse_events(pipeline, ctx, after=after))
