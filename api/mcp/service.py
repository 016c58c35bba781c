"""The MCP tools' backend on the API: the query pipeline, for the HTTP request that carried the call.

That request has come through the door like any other (request id, body limit, API key and
token buckets), so its principal is the caller's key: the call runs the pipeline's steps with it
(validate, result cache, admission, the key's caps, enqueue, relay), as ``POST /v1/query`` does.
Its ``X-Request-Deadline-Ms`` header is the query's deadline.

``search`` is answered as ``POST /v1/query`` answers (single flight: identical concurrent
searches share one computation). ``ask`` relays the events as they come, to report progress,
from a stream of its own (no single flight); a call given up before its answer (cancelled, or
its connection gone) flags the generation cancelled, as a stream that aborts on disconnect does.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

from ragline.api.deps import pipeline_of, principal_of
from ragline.api.errors import ApiError, api_error
from ragline.api.indexes.router import get_index, list_indexes
from ragline.api.mcp.protocol import Progress, Refused
from ragline.api.pipeline import Pipeline, QueryContext, error_of
from ragline.api.query.protocol import QueryRequest, QueryResponse
from ragline.api.query.render import json_answer
from ragline.broker.contract.messages import Done, Error, Restart, Source, Sources, Token
from starlette.requests import Request


def _refused(exc: BaseException) -> Refused:
    """What the API would have answered over HTTP, as the tool's error."""
    error = api_error(exc)
    retry = error.headers.get("Retry-After")
    return Refused(error.status, error.error, error.message, retry_after_s=float(retry) if retry else None)


class PipelineBackend:
    def __init__(self, request: Request) -> None:
        self._request = request

    async def query(self, body: dict[str, Any], progress: Progress | None) -> QueryResponse:
        request = self._request
        pipeline = pipeline_of(request)
        try:
            ctx = pipeline.context(
                QueryRequest.model_validate(body),
                request_id=request.state.request_id,
                deadline_ms=request.headers.get("x-request-deadline-ms"),
                single_flight=progress is None,
                principal=principal_of(request),
            )
            if progress is None:
                answer = QueryResponse.model_validate_json(await json_answer(pipeline, ctx))
            else:
                answer = await _relayed(pipeline, ctx, progress)
        except Exception as exc:
            raise _refused(exc) from exc
        # How the query was answered, for the request-latency metric (as the query routes do).
        request.state.answered_as = ctx.answered_as
        return answer

    async def indexes(self) -> dict[str, Any]:
        try:
            return (await list_indexes(self._request)).model_dump(mode="json")
        except Exception as exc:
            raise _refused(exc) from exc

    async def index(self, name: str) -> dict[str, Any]:
        try:
            return (await get_index(name, self._request)).model_dump(mode="json")
        except Exception as exc:
            raise _refused(exc) from exc


async def _relayed(pipeline: Pipeline, ctx: QueryContext[Any], progress: Progress) -> QueryResponse:
    """The answer to a started request, its events told to ``progress`` as they come."""
    await pipeline.start(ctx)
    if ctx.cached is not None:
        cached = QueryResponse.model_validate_json(pipeline.cached_json(ctx))
        await progress.retrieved(len(cached.sources))
        return cached
    sources: list[Source] = []
    finished = False
    try:
        async with aclosing(pipeline.relay(ctx)) as events:
            async for event in events:
                payload = event.payload
                if isinstance(payload, Sources):
                    sources = payload.sources
                    await progress.retrieved(len(sources))
                elif isinstance(payload, Token):
                    await progress.generated(payload.text)
                elif isinstance(payload, Restart):
                    await progress.restarted()
                elif isinstance(payload, Error):
                    finished = True
                    raise error_of(payload)
                elif isinstance(payload, Done):
                    finished = True
                    return QueryResponse.from_done(payload, request_id=ctx.request_id, sources=sources)
    finally:
        if not finished:
            # Nobody will read the rest: stop spending the engine on it.
            pipeline.cancel_soon(ctx.request_id)
    raise ApiError(500, "failed", "the event stream ended without an answer")
