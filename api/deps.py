"""What the query routes share: the request as the pipeline's context, and its event stream
opened or resumed the same way whichever endpoint renders it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from fastapi import Header, Request
from ragline.api.pipeline import Pipeline, QueryContext, R
from ragline.api.query.protocol import QueryRequest
from ragline.api.sse import EventStream

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# Renders a request's events (from its context) as SSE frames.
Render = Callable[[QueryContext[R]], AsyncIterator[bytes]]

# Read as text: the pipeline's validate step checks it (one positive integer) with the body.
DEADLINE = Header(
    default=None,
    alias="X-Request-Deadline-Ms",
    description="This request's deadline in ms (clamped to the server's bounds); the server "
    "degrades or refuses work it predicts cannot finish in time.",
)


def pipeline_of(request: Request) -> Pipeline:
    return request.app.state.pipeline


def principal_of(request: Request) -> str:
    """The caller's key id, as the door set it (``anonymous`` with keys off)."""
    return getattr(request.state, "principal", "anonymous")


async def validated(
    request: Request,
    model: type[R],
    deadline_ms: str | None,
    *,
    single_flight: bool = False,
    streamed: bool = False,
) -> QueryContext[R]:
    """The pipeline's validate step on this request's body and headers, for its caller."""
    return pipeline_of(request).validate(
        await request.body(),
        request_id=request.state.request_id,
        model=model,
        content_type=request.headers.get("content-type"),
        deadline_ms=deadline_ms,
        single_flight=single_flight,
        principal=principal_of(request),
        streamed=streamed,
    )


async def opened_stream(request: Request, ctx: QueryContext[R], render: Render[R]) -> EventStream:
    """Start a validated request and stream its events as ``render`` frames them. A refusal is an
    HTTP status, raised here before the stream begins; a replayed cached answer has no stream to
    come back to, so only a computed one is owned for a later resume."""
    pipeline = pipeline_of(request)
    await pipeline.start(ctx)
    if ctx.cached is None:
        await pipeline.own(ctx.request_id, principal_of(request))
    request.state.answered_as = ctx.answered_as
    headers = {**SSE_HEADERS, "X-Request-Id": ctx.request_id}
    return EventStream(render(ctx), on_close=lambda: pipeline.let_go(ctx), headers=headers)


async def resumed_stream(request: Request, request_id: str, render: Render[QueryRequest]) -> EventStream:
    """A stream of the caller's own (else 404) again, as ``render`` frames it."""
    pipeline = pipeline_of(request)
    ctx = await pipeline.resumed(request_id, principal_of(request))
    headers = {**SSE_HEADERS, "X-Request-Id": request_id}
    return EventStream(render(ctx), on_close=lambda: pipeline.let_go(ctx), headers=headers)


def valid_resume_point(request_id: str, event_id: str) -> bool:
    """A request id (ascii letters and digits) and a Redis stream entry id (``<ms>-<seq>``)."""
    ms, _, seq = event_id.partition("-")
    valid_request_id = request_id.isascii() and request_id.isalnum()
    return valid_request_id and event_id.isascii() and ms.isdigit() and seq.isdigit()
