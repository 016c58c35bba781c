"""POST /v1/chat/completions (OpenAI's chat API, answered by the query pipeline), its stream's resume
GET /v1/chat/completions/{id}/stream, and GET /v1/models (the indexes, as OpenAI lists models).

A thin adapter like :mod:`api.routers.query`: the chat body read as OpenAI's clients send it, the
query request made of it, then the pipeline's steps and a renderer (:mod:`api.render_openai`).
Errors take OpenAI's shape on these paths (:mod:`api.errors`).
"""

from __future__ import annotations

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response

from api.errors import ApiError
from api.openai_protocol import (
    ChatCompletion,
    ChatCompletionRequest,
    ModelCard,
    ModelList,
    query_request,
    request_id_of,
)
from api.pipeline.validate import parse_body
from api.protocol import json_body
from api.render_openai import chat_completion, chat_stream
from api.routers.deps import DEADLINE, pipeline_of, principal_of
from api.sse import EventStream
from broker import indexes
from broker.keys import Keys

router = APIRouter(prefix="/v1", tags=["openai"])

_OPENAI_ERROR = {
    "description": 'OpenAI\'s error shape: {"error": {"message", "type", "param", "code"}}',
    "content": {"application/json": {}},
}
_ERRORS = {status: _OPENAI_ERROR for status in (400, 401, 404, 413, 429, 503, 504)}
_SSE = {**_ERRORS, 200: {"content": {"text/event-stream": {}, "application/json": {}}}}
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
LAST_EVENT_ID = Header(
    default=None,
    alias="Last-Event-ID",
    description="Resume a stream after this event (`<request id>:<event id>`, as its chunks' `id:`).",
)
# The query request's fields that a chat request names otherwise.
_CHAT_PARAM = {"query": "messages", "index": "model"}


@router.post(
    "/chat/completions",
    response_model=ChatCompletion,
    responses=_SSE,
    openapi_extra=json_body(ChatCompletionRequest),
)
async def chat_completions(
    request: Request, deadline_ms: str | None = DEADLINE, last_event_id: str | None = LAST_EVENT_ID
) -> Response:
    """An answer from the index that ``model`` names, to the last message, with the turns before
    it in the prompt. With ``stream``: ``chat.completion.chunk`` events, then ``data: [DONE]``;
    sent again with ``Last-Event-ID``, the stream resumes after that event."""
    pipeline = pipeline_of(request)
    try:
        chat = parse_body(await request.body(), ChatCompletionRequest, request.headers.get("content-type"))
        if chat.stream and last_event_id is not None:
            request_id, after = _resume_point(last_event_id, None)
            return await _resumed(request, request_id, after, model=chat.model)
        ctx = pipeline.context(
            query_request(chat),
            request_id=request.state.request_id,
            deadline_ms=deadline_ms,
            single_flight=not chat.stream,
            principal=principal_of(request),
            streamed=chat.stream,
        )
        if not chat.stream:
            body = await chat_completion(pipeline, ctx, model=chat.model)
            request.state.answered_as = ctx.answered_as
            return Response(body, media_type="application/json")
        await pipeline.start(ctx)  # a refusal is an HTTP status, before the stream begins
        if ctx.cached is None:  # a replayed cached answer has no stream to come back to
            await pipeline.own(ctx.request_id, principal_of(request))
    except ApiError as exc:
        raise _chat_error(exc) from None
    request.state.answered_as = ctx.answered_as
    return EventStream(
        chat_stream(pipeline, ctx, model=chat.model),
        on_close=lambda: pipeline.let_go(ctx),
        headers={**_SSE_HEADERS, "X-Request-Id": ctx.request_id},
    )


@router.get("/chat/completions/{completion_id}/stream", responses=_SSE)
async def resume_chat_stream(
    completion_id: str, request: Request, last_event_id: str | None = LAST_EVENT_ID
) -> EventStream:
    """A completion's stream again (``completion_id``: its ``id``); with ``Last-Event-ID`` only
    the chunks after that event, then ``[DONE]``."""
    request_id, after = _resume_point(last_event_id, request_id_of(completion_id))
    return await _resumed(request, request_id, after)


@router.get("/models", response_model=ModelList, responses=_ERRORS)
async def list_models(request: Request) -> ModelList:
    """Every index as a model: its id is the index's name, with its version and document count."""
    settings = request.app.state.settings
    found = await indexes.alist(request.app.state.redis, Keys(settings.redis.key_prefix))
    return ModelList(data=[ModelCard.of(info) for info in sorted(found, key=lambda i: i.name)])


@router.get("/models/{model}", response_model=ModelCard, responses=_ERRORS)
async def get_model(model: str, request: Request) -> ModelCard:
    settings = request.app.state.settings
    info = await indexes.alookup(request.app.state.redis, Keys(settings.redis.key_prefix), model)
    if info is None:
        raise _unknown_model(model)
    return ModelCard.of(info)


async def _resumed(request: Request, request_id: str, after: str, *, model: str = "") -> EventStream:
    pipeline = pipeline_of(request)
    ctx = await pipeline.resumed(request_id, principal_of(request))
    return EventStream(
        chat_stream(pipeline, ctx, model=model, after=after),
        on_close=lambda: pipeline.let_go(ctx),
        headers={**_SSE_HEADERS, "X-Request-Id": request_id},
    )


def _resume_point(last_event_id: str | None, request_id: str | None) -> tuple[str, str]:
    """(request id, event id) to resume from: ``Last-Event-ID`` is ``<request id>:<event id>``
    (a bare event id too when the path names the request); none at all is from the start."""
    if last_event_id is None:
        if request_id is None:
            raise _bad_resume()
        return _checked(request_id, "0-0")
    named, sep, event_id = last_event_id.rpartition(":")
    if not sep:
        if request_id is None:
            raise _bad_resume()
        named = request_id
    if request_id is not None and named != request_id:
        raise _bad_resume()
    return _checked(named, event_id)


def _checked(request_id: str, event_id: str) -> tuple[str, str]:
    ms, _, seq = event_id.partition("-")
    if not (
        request_id.isascii()
        and request_id.isalnum()
        and event_id.isascii()
        and ms.isdigit()
        and seq.isdigit()
    ):
        raise _bad_resume()
    return request_id, event_id


def _bad_resume() -> ApiError:
    return ApiError(
        400,
        "invalid_request_error",
        "Last-Event-ID must be a chunk's id, `<request id>:<event id>`, of the completion being resumed",
        param="Last-Event-ID",
    )


def _unknown_model(model: str) -> ApiError:
    return ApiError(
        404,
        "model_not_found",
        f"the model {model!r} does not exist: GET /v1/models lists them",
        param="model",
    )


def _chat_error(exc: ApiError) -> ApiError:
    """A pipeline's error in the chat request's terms (its fields, OpenAI's code for a model)."""
    if exc.error == "unknown_index":
        return ApiError(404, "model_not_found", exc.message, param="model")
    exc.param = _CHAT_PARAM.get(exc.param or "", exc.param)
    return exc
