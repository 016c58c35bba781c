"""OpenAI's bodies for the pipeline's outcome: a ``chat.completion``, or ``chat.completion.chunk``
server-sent events ending with ``data: [DONE]``.

Built on :mod:`ragline.api.query.render`: the JSON answer is ``POST /v1/query``'s, turned into a completion; a
stream is the request's events, each turned into at most one chunk by :class:`ChunkStream`.

A stream's chunks are a function of its events alone, so every connection to it sends the same
chunks under the same ids: a resumed stream reads the events again from the first, and sends
only the chunks after ``Last-Event-ID``, with no gap and no duplicate. Each SSE ``id`` is
``<request id>:<event id>`` (the POST that reconnects with it names no request of its own); the
closing ``[DONE]`` carries the last chunk's id, and every connection ends with it.

The content of the chunks joined is the final answer (``message.content`` of the same request
answered as JSON): the generation's text with leading and trailing whitespace held back, and the
tokens of a redelivered generation (after a ``restart`` event) sent only where they go past what
was already sent. Should a redelivered generation depart from what was sent (sampling with
temperature > 0), its chunk carries ``ragline.restart: true`` and content that starts the
answer again: a client drops what it has joined. With greedy decoding (temperature 0, the
default) a redelivery regenerates the same text, and no such chunk is sent.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import aclosing
from typing import Any

from ragline.api.chat.protocol import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChunkChoice,
    CompletionUsage,
    Delta,
    Ragline,
    completion_id,
)
from ragline.api.errors import api_error, openai_error
from ragline.api.pipeline import Pipeline, QueryContext, error_of
from ragline.api.query.protocol import QueryResponse
from ragline.api.query.render import cached_events, json_answer, paced_relay
from ragline.api.sse import HEARTBEAT
from ragline.broker.contract.messages import Done, Error, Restart, Source, Sources, Token
from ragline.broker.streams.events import Event

DONE_DATA = "[DONE]"


def answer_text(done: Done, sources: list[Source]) -> str:
    """The completion's text: the answer, or (degraded, or retrieval-only) the notice that says
    why there is none and the sources, numbered as a generated answer would cite them."""
    if done.answer is not None:
        return done.answer
    notice = done.notice or "No answer was generated; these are the retrieved sources."
    listed = "\n".join(f"[{n}] {s.title} ({s.source})" for n, s in enumerate(sources, start=1))
    return f"{notice}\n\n{listed}" if listed else notice


def completion_of(response: QueryResponse, *, model: str, created: int) -> ChatCompletion:
    """``POST /v1/query``'s answer as a ``chat.completion``."""
    return ChatCompletion(
        id=completion_id(response.request_id),
        created=created,
        model=model,
        choices=[
            Choice(
                message=AssistantMessage(content=answer_text(response, response.sources)),
                finish_reason=response.finish_reason or "stop",
            )
        ],
        usage=CompletionUsage.of(response),
        ragline=Ragline.of(response, request_id=response.request_id, sources=response.sources),
    )


async def chat_completion(pipeline: Pipeline, ctx: QueryContext[Any], *, model: str) -> bytes:
    """``POST /v1/chat/completions`` without ``stream``: the pipeline's JSON answer as a completion."""
    response = QueryResponse.model_validate_json(await json_answer(pipeline, ctx))
    return completion_of(response, model=model, created=int(time.time())).model_dump_json().encode()


def _stream_id(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq)


class ChunkStream:
    """One request's events as chunk payloads (the JSON of each ``data:``), deterministically."""

    def __init__(self, request_id: str, *, model: str = "", created: int = 0) -> None:
        self.request_id = request_id
        self.model = model
        self.created = created
        self._sources: list[Source] = []
        self._sent = ""  # the content sent so far
        self._generated = ""  # the current generation's text (since the last restart)

    def feed(self, event: Event) -> str | None:
        """The chunk (or error) ``event`` adds to the stream, or None when it adds nothing."""
        payload = event.payload
        if not self.created:
            self.created = _stream_id(event.id)[0] // 1000 or int(time.time())
        if isinstance(payload, Sources):
            self._sources = payload.sources
            self.model = payload.index or self.model
            extension = Ragline(
                request_id=self.request_id,
                sources=payload.sources,
                partial=payload.partial,
                partial_shards=payload.partial_shards,
            )
            return self._chunk(Delta(role="assistant", content=""), ragline=extension)
        if isinstance(payload, Token):
            self._generated += payload.text
            return self._content(self._generated.strip())
        if isinstance(payload, Restart):
            self._generated = ""
            return None
        if isinstance(payload, Done):
            return self._final(payload)
        if isinstance(payload, Error):
            return json.dumps(openai_error(error_of(payload)))
        return None

    def _content(self, text: str, *, final: Done | None = None) -> str | None:
        """A chunk bringing the content sent up to ``text``: what goes past it, nothing while a
        restarted generation catches up, or a restart when ``text`` departs from it."""
        restart = False
        if text.startswith(self._sent):
            delta, self._sent = text[len(self._sent) :], text
        elif self._sent.startswith(text) and final is None:
            delta = ""
        else:
            delta, restart, self._sent = text, True, text
        extension: Ragline | None
        if final is not None:
            extension = Ragline.of(final, request_id=self.request_id, restart=restart or None)
            return self._chunk(
                Delta(content=delta or None),
                finish_reason=final.finish_reason or "stop",
                usage=CompletionUsage.of(final),
                ragline=extension,
            )
        if not delta:
            return None
        extension = Ragline(request_id=self.request_id, restart=True) if restart else None
        return self._chunk(Delta(content=delta), ragline=extension)

    def _final(self, done: Done) -> str | None:
        return self._content(answer_text(done, self._sources), final=done)

    def _chunk(self, delta: Delta, **fields: Any) -> str:
        chunk = ChatCompletionChunk(
            id=completion_id(self.request_id),
            created=self.created,
            model=self.model,
            choices=[ChunkChoice(delta=delta, finish_reason=fields.pop("finish_reason", None))],
            **fields,
        )
        return chunk.model_dump_json(exclude_none=True)


def chat_frame(request_id: str, event_id: str, data: str) -> bytes:
    return f"id: {request_id}:{event_id}\ndata: {data}\n\n".encode()


async def chat_stream(
    pipeline: Pipeline, ctx: QueryContext[Any], *, model: str = "", after: str = "0-0"
) -> AsyncIterator[bytes]:
    """The request's chunks after ``after`` (an event id), then ``[DONE]``, with heartbeats while it
    waits. A failure mid-stream (no answer in time, Redis gone, a stall) ends it with OpenAI's
    error object, never a stream cut short."""
    chunks = ChunkStream(ctx.request_id, model=model)
    last = after
    try:
        if ctx.cached is not None:
            chunks.created = int(time.time())
            events: AsyncGenerator[Event, None] = _iterate(cached_events(pipeline, ctx))
        else:
            events = pipeline.relay(ctx)
        async with aclosing(paced_relay(pipeline, ctx, events)) as reading:
            async for event in reading:
                if event is None:
                    yield HEARTBEAT
                    continue
                data = chunks.feed(event)
                if data is None or _stream_id(event.id) <= _stream_id(after):
                    continue
                last = event.id
                yield chat_frame(ctx.request_id, event.id, data)
    except Exception as exc:
        yield chat_frame(ctx.request_id, last, json.dumps(openai_error(api_error(exc))))
    yield chat_frame(ctx.request_id, last, DONE_DATA)


async def _iterate(events: Iterable[Event]) -> AsyncGenerator[Event, None]:
    for event in events:
        yield event
