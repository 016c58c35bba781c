"""The OpenAI-compatible endpoints' bodies: ``POST /v1/chat/completions`` and ``GET /v1/models``.

A request is read as OpenAI's clients send it: the fields ragline uses are checked for their types
(a wrong type is a 400 in OpenAI's error shape), every other field OpenAI defines, or any field at
all, is accepted and ignored. It becomes a
:class:`~ragline.api.query.protocol.QueryRequest` (:func:`query_request`),
and from there it is the same query as ``POST /v1/query``'s: ``model`` names the index, the last
message (the user's) is the question retrieval searches for, and the user and assistant turns
before it are the conversation's history.

Responses are OpenAI's, with one extension object, ``ragline``: the request's id, its sources,
and every field of the answer's ``done`` that OpenAI's shape has no place for (see :class:`Ragline`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
)
from pydantic.json_schema import SkipJsonSchema
from ragline.api.errors import ApiError
from ragline.api.query.protocol import QueryRequest
from ragline.broker.contract.messages import ChatTurn, Done, Source, Timings, Usage

if TYPE_CHECKING:
    from ragline.broker.contract.records import IndexInfo

COMPLETION_PREFIX = "chatcmpl-"
# OpenAI's roles; only user and assistant turns reach the prompt (ragline's own system prompt
# grounds the answer in the sources, so a caller's system message is read and not used).
Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


def _invalid(message: str, param: str) -> ApiError:
    return ApiError(400, "invalid_request_error", message, param=param)


class _Lenient(BaseModel):
    # OpenAI's clients send fields ragline has no use for (and new ones with each release).
    model_config = ConfigDict(extra="ignore")


class ContentPart(_Lenient):
    type: StrictStr
    text: StrictStr | None = None


class ChatMessage(_Lenient):
    role: Role
    content: StrictStr | list[ContentPart] | None = None

    def text(self, at: int) -> str:
        """The message's text: its string, or its text parts joined; 400 for any other part."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        texts = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise _invalid(
                    f"messages[{at}]: only text content is supported, not {part.type!r}", "messages"
                )
            texts.append(part.text)
        return "".join(texts)


class ChatCompletionRequest(_Lenient):
    model: StrictStr = Field(description="The index to answer from (`GET /v1/models` lists them).")
    messages: list[ChatMessage] = Field(
        min_length=1,
        description="The conversation; the last is the user's question, retrieval searches for it.",
    )
    stream: StrictBool = False
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = Field(
        default=None, description="OpenAI's newer name for max_tokens."
    )
    temperature: StrictInt | StrictFloat | None = None
    stop: StrictStr | list[StrictStr] | None = None
    user: StrictStr | None = Field(default=None, description="Accepted; the API key names the caller.")
    n: StrictInt | None = Field(default=None, description="Only 1 is supported.")


def query_request(req: ChatCompletionRequest) -> QueryRequest:
    """The chat request as the pipeline's query request (400 for a conversation it cannot answer)."""
    if not req.model:
        raise _invalid("model must name an index (GET /v1/models lists them)", "model")
    if req.n not in (None, 1):
        raise _invalid("only n=1 is supported", "n")
    *earlier, last = req.messages
    if last.role != "user":
        raise _invalid("the last message must be the user's question", "messages")
    history = [
        ChatTurn(role=m.role, content=text)
        for at, m in enumerate(earlier)
        if m.role in ("user", "assistant") and (text := m.text(at))
    ]
    stop = [req.stop] if isinstance(req.stop, str) else req.stop
    return QueryRequest(
        query=last.text(len(earlier)),
        index=req.model,
        history=history,
        max_tokens=req.max_completion_tokens if req.max_tokens is None else req.max_tokens,
        temperature=req.temperature,
        stop=stop,
        # A client that goes away can resume (Last-Event-ID): the answer is generated to its end.
        abort_on_disconnect=False,
    )


def completion_id(request_id: str) -> str:
    return COMPLETION_PREFIX + request_id


def request_id_of(completion: str) -> str:
    """The request id of a completion id (``chatcmpl-<request id>``, or the bare request id)."""
    return completion.removeprefix(COMPLETION_PREFIX)


# -- responses -------------------------------------------------------------------------------------


class Ragline(Done):
    """ragline's extension object: what the OpenAI schema has no field for. Built on the answer's
    `done`, so it carries every field of it (`citations`, `degraded`, `timings`, `partial`, ...)
    but those OpenAI's own fields already carry (the answer's text, its usage, why it finished),
    with the request's id and its sources. A stream's chunks before the last carry only the
    request's id and its sources (the first chunk) or ``restart``."""

    # In the completion's own fields: `message.content` (or `delta.content`), `usage`, `finish_reason`.
    answer: SkipJsonSchema[str | None] = Field(default=None, exclude=True)
    usage: SkipJsonSchema[Usage | None] = Field(default=None, exclude=True)
    finish_reason: SkipJsonSchema[Literal["stop", "length"] | None] = Field(default=None, exclude=True)
    # None on a stream's chunks before the last.
    timings: Timings | None = None  # type: ignore[assignment]

    request_id: str
    sources: list[Source] | None = Field(
        default=None, description="The retrieved sources, [1] first. Streams: in the first chunk."
    )
    restart: bool | None = Field(
        default=None,
        description="Streams only: drop the content joined so far; this chunk's content starts it again "
        "(a redelivered generation that departed from what was streamed).",
    )

    @classmethod
    def of(
        cls, done: Done, *, request_id: str, sources: list[Source] | None = None, restart: bool | None = None
    ) -> Ragline:
        return cls.from_done(done, request_id=request_id, sources=sources, restart=restart)


class CompletionUsage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    @classmethod
    def of(cls, done: Done) -> CompletionUsage:
        u = done.usage
        if u is None:
            return cls()
        return cls(
            prompt_tokens=u.prompt_tokens,
            completion_tokens=u.completion_tokens,
            total_tokens=u.prompt_tokens + u.completion_tokens,
        )


FinishReason = Literal["stop", "length"]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    # Serialised as what it is: an answer of a model with more fields than Ragline keeps them.
    ragline: SerializeAsAny[Ragline]


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None
    ragline: SerializeAsAny[Ragline] | None = None


class ModelCard(BaseModel):
    """An index, as OpenAI's clients list models."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(description="When its current version was written (Unix seconds).")
    owned_by: str = "ragline"
    version: str
    documents: int | None
    chunks: int

    @classmethod
    def of(cls, info: IndexInfo) -> ModelCard:
        return cls(
            id=info.name,
            created=version_created(info.version),
            version=info.version,
            documents=info.documents,
            chunks=info.chunks,
        )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def version_created(version: str) -> int:
    """When an index version was written, from its name (``20260101T120000123456Z-…``); 0 if not so named."""
    try:
        return int(
            datetime.strptime(version.split("-", 1)[0], "%Y%m%dT%H%M%S%fZ").replace(tzinfo=UTC).timestamp()
        )
    except ValueError:
        return 0
