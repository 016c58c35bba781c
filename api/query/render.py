"""How the query endpoints render the pipeline's outcome: one JSON answer, or server-sent events.

The job endpoint renders a job record instead (:mod:`ragline.api.jobs.service`), the
OpenAI-compatible endpoint
OpenAI's bodies (:mod:`ragline.api.chat.render`, built on these). A renderer decides nothing: the
pipeline's steps have validated, looked up, admitted and enqueued the request; a renderer only
turns the cached answer or the relayed events into its format.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from ragline.api.errors import ApiError, api_error
from ragline.api.pipeline import Pipeline, QueryContext, error_of
from ragline.api.query.protocol import QueryResponse, StreamDone
from ragline.api.sse import HEARTBEAT, frame, paced
from ragline.broker.contract.messages import Done, Error, Source, Sources, Token
from ragline.broker.streams.events import FINAL_EVENTS, Event


async def json_answer(pipeline: Pipeline, ctx: QueryContext[Any]) -> bytes:
    """``POST /v1/query``: the whole answer as one JSON body."""
    await pipeline.start(ctx)
    if ctx.cached is not None:
        return pipeline.cached_json(ctx)
    sources: list[Source] = []
    async with aclosing(pipeline.relay(ctx)) as events:
        async for event in events:
            payload = event.payload
            if isinstance(payload, Sources):
                sources = payload.sources
            elif isinstance(payload, Error):
                raise error_of(payload)
            elif isinstance(payload, Done):
                response = QueryResponse.from_done(payload, request_id=ctx.request_id, sources=sources)
                return response.model_dump_json().encode()
    raise ApiError(500, "failed", "the event stream ended without an answer")


def sse_answer(
    pipeline: Pipeline, ctx: QueryContext[Any], *, abort_on_disconnect: bool
) -> AsyncIterator[bytes]:
    """``POST /v1/query/stream``, once :meth:`Pipeline.start` has run: a cached answer replayed,
    or the request's events as they come."""
    if ctx.cached is not None:
        return _replay(pipeline, ctx)
    return sse_events(pipeline, ctx, abort_on_disconnect=abort_on_disconnect)


def cached_events(pipeline: Pipeline, ctx: QueryContext[Any]) -> list[Event]:
    """A cached answer as the events of a stream: its sources, the whole answer as one token, done."""
    body = QueryResponse.model_validate_json(pipeline.cached_json(ctx))
    events = [Event("0-1", Sources(sources=body.sources))]
    if body.answer:
        events.append(Event("0-2", Token(text=body.answer)))
    events.append(Event("0-3", Done.from_done(body, cached=True)))
    return events


async def _replay(pipeline: Pipeline, ctx: QueryContext[Any]) -> AsyncIterator[bytes]:
    for event in cached_events(pipeline, ctx):
        payload = event.payload
        if isinstance(payload, Done):
            payload = StreamDone.from_done(payload, request_id=ctx.request_id)
        yield frame(event.type, payload.encode(), event_id=event.id)


def paced_relay(
    pipeline: Pipeline, ctx: QueryContext[Any], events: AsyncGenerator[Event, None]
) -> AsyncGenerator[Event | None, None]:
    """A stream's events, with None for each heartbeat it is due while it waits; stalled (raising
    :class:`~ragline.api.sse.StreamStalled`) after the stall limit with no new event, or after
    its request's deadline when that is longer: its client agreed to wait that long."""
    s = pipeline.settings
    return paced(events, heartbeat_s=s.sse_heartbeat_s, stall_s=max(s.stream_stall_s, ctx.deadline_s))


async def sse_events(
    pipeline: Pipeline, ctx: QueryContext[Any], *, after: str = "0-0", abort_on_disconnect: bool = False
) -> AsyncIterator[bytes]:
    """The request's events after ``after`` as SSE, with heartbeats while it waits; a failure
    mid-stream (no answer in time, Redis gone, a stall) ends it with an ``error`` event, never a
    stream cut short."""
    finished = False
    try:
        async with aclosing(paced_relay(pipeline, ctx, pipeline.relay(ctx, after=after))) as events:
            async for event in events:
                if event is None:
                    yield HEARTBEAT
                    continue
                finished = event.type in FINAL_EVENTS
                payload = event.payload
                if isinstance(payload, Done):
                    payload = StreamDone.from_done(payload, request_id=ctx.request_id)
                yield frame(event.type, payload.encode(), event_id=event.id)
    except Exception as exc:
        error = api_error(exc)
        yield frame(Error.type, Error(status=error.status, message=error.message).encode())
    finally:
        if not finished and abort_on_disconnect:
            # The client went away mid-answer: stop spending the engine on it (the generation
            # task sees the flag within ~100 ms and aborts the request in the engine).
            pipeline.cancel_soon(ctx.request_id)
