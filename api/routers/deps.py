"""What the query routes share: the request as the pipeline's context."""

from __future__ import annotations

from fastapi import Header, Request

from api.pipeline import Pipeline, QueryContext, R

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
