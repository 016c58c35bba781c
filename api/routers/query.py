"""POST /v1/query (JSON answer) and POST /v1/query/stream (SSE), plus SSE resume by request id."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response, StreamingResponse

from api.admission import Decision
from api.errors import ApiError
from api.protocol import ErrorBody, QueryRequest, QueryResponse, StreamDone
from api.serving import QueryService, degraded_fields, finished_done, splice
from api.sse import frame
from broker import metrics
from broker.contract import Done, Sources, Token
from broker.events import FINAL_EVENTS, EventTimeout

router = APIRouter(prefix="/v1", tags=["query"])

_ERRORS = {
    400: {"model": ErrorBody},
    401: {"model": ErrorBody},
    404: {"model": ErrorBody},
    422: {"model": ErrorBody},
    429: {"model": ErrorBody},
    503: {"model": ErrorBody},
    504: {"model": ErrorBody},
}
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _service(request: Request) -> QueryService:
    return request.app.state.query_service


def _deadline_s(request: Request, header_ms: int | None) -> float:
    return request.app.state.admission.deadline_s(header_ms)


_DEADLINE = Header(
    default=None,
    alias="X-Request-Deadline-Ms",
    ge=1,
    description="This request's deadline in ms (clamped to the server's bounds); the server "
    "degrades or refuses work it predicts cannot finish in time.",
)


@router.post("/query", response_model=QueryResponse, responses=_ERRORS)
async def query(
    body: QueryRequest, request: Request, deadline_ms: int | None = _DEADLINE
) -> QueryResponse | Response:
    started = time.perf_counter()
    answer = await _service(request).answer(
        request.state.request_id, body, deadline_s=_deadline_s(request, deadline_ms)
    )
    metrics.REQUEST_SECONDS.labels("/v1/query", body.mode).observe(time.perf_counter() - started)
    if isinstance(answer, bytes):  # a cache hit, already JSON
        return Response(content=answer, media_type="application/json")
    # Serialised once, here: the model was built from validated parts (response_model stays for the docs).
    return Response(content=answer.model_dump_json(), media_type="application/json")


async def _replay(request_id: str, cached: bytes, degraded: Decision | None = None) -> AsyncIterator[bytes]:
    """A cached answer as a stream: its sources, the whole answer as one token, done."""
    body = QueryResponse.model_validate_json(splice(request_id, cached))
    yield frame(Sources.type, Sources(sources=body.sources).encode(), event_id="0-1")
    if body.answer:
        yield frame(Token.type, Token(text=body.answer).encode(), event_id="0-2")
    done = StreamDone.from_done(body, request_id=request_id, cached=True, **degraded_fields(degraded))
    yield frame(Done.type, done.encode(), event_id="0-3")


async def _relay(
    service: QueryService,
    request_id: str,
    after: str,
    started: float,
    *,
    settle: bool = False,
    degraded: Decision | None = None,
    mode: str = "rag",
    abort_on_disconnect: bool = False,
    predicted_wait_s: float | None = None,
) -> AsyncIterator[bytes]:
    finished = False
    try:
        async for event in service.events(request_id, after=after, settle=settle):
            finished = event.type in FINAL_EVENTS
            payload = event.payload
            if isinstance(payload, Done):
                metrics.REQUEST_SECONDS.labels("/v1/query/stream", mode).observe(
                    time.perf_counter() - started
                )
                done = finished_done(payload, started, predicted_wait_s)
                payload = StreamDone.from_done(done, request_id=request_id, **degraded_fields(degraded))
            yield frame(event.type, payload.encode(), event_id=event.id)
    except EventTimeout:
        timeout = {"status": 504, "message": "no answer in time", "request_id": request_id}
        yield frame("error", json.dumps(timeout, separators=(",", ":")))
    finally:
        if not finished and abort_on_disconnect:
            # The client went away mid-answer: stop spending the engine on it (the generation
            # task sees the flag within ~100 ms and aborts the request in the engine).
            service.cancel_soon(request_id)


@router.post("/query/stream", responses={**_ERRORS, 200: {"content": {"text/event-stream": {}}}})
async def query_stream(
    body: QueryRequest, request: Request, deadline_ms: int | None = _DEADLINE
) -> StreamingResponse:
    service = _service(request)
    request_id = request.state.request_id
    started = time.perf_counter()
    plan = await service.plan_stream(request_id, body, deadline_s=_deadline_s(request, deadline_ms))
    if plan.cached is not None:
        stream = _replay(request_id, plan.cached, plan.degraded)
    else:
        stream = _relay(
            service,
            request_id,
            "0-0",
            started,
            settle=True,
            degraded=plan.degraded,
            mode=body.mode,
            abort_on_disconnect=body.abort_on_disconnect,
            predicted_wait_s=plan.predicted_wait_s,
        )
    return StreamingResponse(
        stream,
        media_type="text/event-stream",
        headers={**_SSE_HEADERS, "X-Request-Id": request_id},
    )


@router.get("/query/stream/{request_id}", responses={**_ERRORS, 200: {"content": {"text/event-stream": {}}}})
async def resume_stream(
    request_id: str, request: Request, last_event_id: str | None = Header(default=None)
) -> StreamingResponse:
    """Reconnect to a request's stream; with ``Last-Event-ID`` only the events after it are sent."""
    after = last_event_id or "0-0"
    if not _valid_stream_id(after) or not request_id.isalnum():
        raise ApiError(422, "invalid_request", "bad request id or Last-Event-ID")
    return StreamingResponse(
        _relay(_service(request), request_id, after, time.perf_counter()),
        media_type="text/event-stream",
        headers=_SSE_HEADERS,
    )


def _valid_stream_id(value: str) -> bool:
    ms, _, seq = value.partition("-")
    return ms.isdigit() and seq.isdigit()
