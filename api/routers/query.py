"""POST /v1/query (JSON answer) and POST /v1/query/stream (SSE), plus SSE resume by request id.

Each is a thin adapter: the pipeline's context from the request, the pipeline's steps, a renderer.
"""

from __future__ import annotations

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response

from api.errors import ApiError
from api.protocol import ErrorBody, QueryRequest, QueryResponse, json_body
from api.render import json_answer, sse_answer, sse_events
from api.routers.deps import DEADLINE, pipeline_of, principal_of, validated
from api.sse import EventStream

router = APIRouter(prefix="/v1", tags=["query"])

_ERRORS = {
    400: {"model": ErrorBody},
    401: {"model": ErrorBody},
    404: {"model": ErrorBody},
    413: {"model": ErrorBody},
    422: {"model": ErrorBody},
    429: {"model": ErrorBody},
    503: {"model": ErrorBody},
    504: {"model": ErrorBody},
}
_SSE = {**_ERRORS, 200: {"content": {"text/event-stream": {}}}}
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@router.post("/query", response_model=QueryResponse, responses=_ERRORS, openapi_extra=json_body(QueryRequest))
async def query(request: Request, deadline_ms: str | None = DEADLINE) -> Response:
    """The whole answer as one JSON body.

    Served below the framework by ``api/fast_path.py``, which calls these same functions; this
    route documents the endpoint, and tests/api/test_fast_path.py holds the two to one behaviour."""
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
    await pipeline.start(ctx)  # a refusal is an HTTP status, before the stream begins
    if ctx.cached is None:  # a replayed cached answer has no stream to come back to
        await pipeline.own(ctx.request_id, principal_of(request))
    request.state.answered_as = ctx.answered_as
    assert ctx.request is not None
    return EventStream(
        sse_answer(pipeline, ctx, abort_on_disconnect=ctx.request.abort_on_disconnect),
        on_close=lambda: pipeline.let_go(ctx),
        headers={**_SSE_HEADERS, "X-Request-Id": ctx.request_id},
    )


@router.get("/query/stream/{request_id}", responses=_SSE)
async def resume_stream(
    request_id: str, request: Request, last_event_id: str | None = Header(default=None)
) -> EventStream:
    """Reconnect to a request's stream; with ``Last-Event-ID`` only the events after it are sent."""
    after = last_event_id or "0-0"
    if not _valid_stream_id(after) or not (request_id.isascii() and request_id.isalnum()):
        raise ApiError(422, "invalid_request", "bad request id or Last-Event-ID")
    pipeline = pipeline_of(request)
    ctx = await pipeline.resumed(request_id, principal_of(request))
    return EventStream(
        sse_events(pipeline, ctx, after=after), on_close=lambda: pipeline.let_go(ctx), headers=_SSE_HEADERS
    )


def _valid_stream_id(value: str) -> bool:
    ms, _, seq = value.partition("-")
    return value.isascii() and ms.isdigit() and seq.isdigit()
