"""POST /v1/chat/completions (OpenAI's chat API, answered by the query pipeline), its stream's resume
GET /v1/chat/completions/{id}/stream, and GET /v1/models (the indexes, as OpenAI lists models).

A thin adapter like :mod:`ragline.api.query.router`: the chat body read as OpenAI's clients send it, the
query request made of it, then the pipeline's steps and a renderer (:mod:`ragline.api.chat.render`).
Errors take OpenAI's shape on these paths (:mod:`ragline.api.errors`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response
from ragline.api.chat.protocol import (
    ChatCompletion,
    ChatCompletionRequest,
    ModelCard,
    ModelList,
    query_request,
    request_id_of,
)
from ragline.api.chat.render import chat_completion, chat_stream
from ragline.api.deps import (
    DEADLINE,
    opened_stream,
    pipeline_of,
    principal_of,
    resumed_stream,
    valid_resume_point,
)
from ragline.api.errors import ApiError
from ragline.api.pipeline.validate import parse_body
from ragline.api.query.protocol import json_body
from ragline.api.sse import EventStream
from ragline.broker.redis.keys import Keys
from ragline.broker.state import indexes, shards

router = APIRouter(prefix="/v1", tags=["openai"])

_OPENAI_ERROR = {
    "description": 'OpenAI\'s error shape: {"error": {"message", "type", "param", "code"}}',
    "content": {"application/json": {}},
}
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: _OPENAI_ERROR for status in (400, 401, 404, 413, 429, 503, 504)
}
_SSE: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    200: {"content": {"text/event-stream": {}, "application/json": {}}},
}
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
        return await opened_stream(request, ctx, lambda c: chat_stream(pipeline, c, model=chat.model))
    except ApiError as exc:
        raise _chat_error(exc) from None


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
    # A sharded index is one model; its shards are not (they cannot be asked).
    queryable = [info for info in found if shards.split_shard(info.name) is None]
    return ModelList(data=[ModelCard.of(info) for info in sorted(queryable, key=lambda i: i.name)])


@router.get("/models/{model}", response_model=ModelCard, responses=_ERRORS)
async def get_model(model: str, request: Request) -> ModelCard:
    settings = request.app.state.settings
    info = await indexes.alookup(request.app.state.redis, Keys(settings.redis.key_prefix), model)
    if info is None or shards.split_shard(model) is not None:
        raise _unknown_model(model)
    return ModelCard.of(info)


async def _resumed(request: Request, request_id: str, after: str, *, model: str = "") -> EventStream:
    pipeline = pipeline_of(request)
    return await resumed_stream(
        request, request_id, lambda ctx: chat_stream(pipeline, ctx, model=model, after=after)
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
    if not valid_resume_point(request_id, event_id):
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
