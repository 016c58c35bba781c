"""A quiet stream's pacing (api/sse.py ``paced``) and how both SSE renderers send it: comment
heartbeats while a request waits, an ``error`` event naming the stall once nothing new has come
for the stall limit, the events in between untouched, and the events' reader closed whichever
way the stream ends. Times are tens of milliseconds: the logic, not a proxy (that is
tests/api/test_proxy_streams.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any

import pytest
from ragline.api.chat.render import chat_stream
from ragline.api.pipeline import QueryContext
from ragline.api.query.render import sse_events
from ragline.api.sse import HEARTBEAT, StreamStalled, paced
from ragline.broker.config.settings import ApiSettings
from ragline.broker.contract.messages import Done, Source, Sources, Token
from ragline.broker.streams.events import Event

pytestmark = pytest.mark.unit

SOURCE = Source(chunk_id="c1", source="cafe.md", title="Café", text="Opens at 7:15.", score=0.9)


class Script:
    """An event source that waits before each item (seconds, item); ``then_hang`` waits forever
    after the last. Records whether it was closed."""

    def __init__(self, steps: Sequence[tuple[float, Any]], *, then_hang: bool = False) -> None:
        self.steps = steps
        self.then_hang = then_hang
        self.closed = False

    async def __call__(self) -> AsyncGenerator[Any, None]:
        try:
            for wait_s, item in self.steps:
                await asyncio.sleep(wait_s)
                yield item
            if self.then_hang:
                await asyncio.Event().wait()
        finally:
            self.closed = True


async def _collect(gen: AsyncGenerator[Any, None]) -> list[Any]:
    async with aclosing(gen) as items:
        return [item async for item in items]


def test_items_pass_through_with_a_heartbeat_for_each_quiet_interval() -> None:
    script = Script([(0.0, "a"), (0.27, "b"), (0.0, "c")])
    got = asyncio.run(_collect(paced(script(), heartbeat_s=0.1, stall_s=5)))
    assert [g for g in got if g is not None] == ["a", "b", "c"]
    # 0.27 s of silence between a and b: heartbeats at 0.1 and 0.2, none after b.
    assert got[0] == "a" and got[-2:] == ["b", "c"]
    assert got[1:-2] == [None, None]
    assert script.closed


def test_no_heartbeat_while_items_keep_coming() -> None:
    script = Script([(0.02, n) for n in range(10)])
    got = asyncio.run(_collect(paced(script(), heartbeat_s=0.1, stall_s=5)))
    assert got == list(range(10))


def test_a_stream_with_nothing_new_for_the_stall_limit_stalls_despite_heartbeats() -> None:
    script = Script([(0.0, "a")], then_hang=True)
    got: list[Any] = []

    async def run() -> None:
        async with aclosing(paced(script(), heartbeat_s=0.05, stall_s=0.3)) as items:
            async for item in items:
                got.append(item)

    started = asyncio.run(_timed(run))
    assert isinstance(started[1], StreamStalled)
    assert 0.3 <= started[0] < 1.0
    assert got[0] == "a" and got[1:] and all(g is None for g in got[1:])
    assert 4 <= len(got) - 1 <= 6  # a heartbeat every 0.05 s until 0.3 s
    error = started[1]
    assert error.status == 504 and error.error == "stalled" and "stalled" in error.message
    assert script.closed, "the stalled stream's reader is closed"


async def _timed(run: Any) -> tuple[float, BaseException | None]:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        await run()
    except Exception as exc:
        return loop.time() - t0, exc
    return loop.time() - t0, None


def test_an_error_of_the_source_is_raised_to_the_reader() -> None:
    async def failing() -> AsyncGenerator[str, None]:
        yield "a"
        raise RuntimeError("redis went away")

    with pytest.raises(RuntimeError, match="redis went away"):
        asyncio.run(_collect(paced(failing(), heartbeat_s=1, stall_s=5)))


def test_closing_the_stream_mid_wait_closes_its_source() -> None:
    script = Script([(0.0, "a")], then_hang=True)

    async def run() -> None:
        items = paced(script(), heartbeat_s=0.05, stall_s=5)
        assert await anext(items) == "a"
        assert await anext(items) is None  # waiting: a heartbeat
        await items.aclose()  # the client went away

    asyncio.run(run())
    assert script.closed


def test_a_cancelled_reader_cancels_the_stream_and_closes_its_source() -> None:
    script = Script([], then_hang=True)

    async def run() -> None:
        async def consume() -> None:
            async with aclosing(paced(script(), heartbeat_s=10, stall_s=10)) as items:
                async for _ in items:
                    pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert script.closed


# -- the renderers ------------------------------------------------------------------------------


class _Pipeline:
    """What a live stream asks of the pipeline: its pacing and its events after an id."""

    def __init__(self, script: Script, *, heartbeat_s: float, stall_s: float) -> None:
        self.settings = ApiSettings(sse_heartbeat_s=heartbeat_s, stream_stall_s=stall_s)
        self.script = script
        self.cancelled: list[str] = []

    async def relay(self, ctx: Any, *, after: str = "0-0") -> AsyncGenerator[Event, None]:
        async with aclosing(self.script()) as events:
            async for event in events:
                yield event

    def cancel_soon(self, request_id: str) -> None:
        self.cancelled.append(request_id)


def _ctx(deadline_s: float = 0.0) -> QueryContext[Any]:
    return QueryContext("r1", request=None, query=None, deadline_s=deadline_s, source_id="r1")


def _waiting_then_answered() -> Script:
    # Sources at once, then a wait (the generation queue), then the answer.
    return Script(
        [
            (0.0, Event("1-0", Sources(sources=[SOURCE], index="docs"))),
            (0.25, Event("1-1", Token(text="At 7:15."))),
            (0.0, Event("1-2", Done(answer="At 7:15."))),
        ]
    )


def test_our_stream_sends_heartbeat_comments_while_it_waits() -> None:
    pipeline = _Pipeline(_waiting_then_answered(), heartbeat_s=0.1, stall_s=5)
    frames = asyncio.run(_collect(sse_events(pipeline, _ctx())))  # type: ignore[arg-type]
    kinds = [f if f == HEARTBEAT else f.decode().split("\n")[1] for f in frames]
    assert kinds == ["event: sources", HEARTBEAT, HEARTBEAT, "event: token", "event: done"]
    assert HEARTBEAT.startswith(b":") and HEARTBEAT.endswith(b"\n\n")  # an SSE comment
    assert pipeline.cancelled == []


def test_our_stalled_stream_ends_with_an_error_event_and_its_work_is_cancelled() -> None:
    script = Script([(0.0, Event("1-0", Sources(sources=[SOURCE], index="docs")))], then_hang=True)
    pipeline = _Pipeline(script, heartbeat_s=0.1, stall_s=0.35)
    frames = asyncio.run(_collect(sse_events(pipeline, _ctx(), abort_on_disconnect=True)))  # type: ignore[arg-type]
    assert frames[0].startswith(b"id: 1-0\nevent: sources")
    assert frames[1:-1] == [HEARTBEAT] * 3
    last = frames[-1].decode().strip().split("\n")
    assert last[0] == "event: error"
    error = json.loads(last[1].removeprefix("data: "))
    assert error["status"] == 504 and "stalled: nothing new for 0.35 s" in error["message"]
    assert pipeline.cancelled == ["r1"]
    assert script.closed


def test_a_request_deadline_longer_than_the_stall_limit_is_waited_for() -> None:
    pipeline = _Pipeline(_waiting_then_answered(), heartbeat_s=0.1, stall_s=0.15)
    frames = asyncio.run(_collect(sse_events(pipeline, _ctx(deadline_s=1.0))))  # type: ignore[arg-type]
    assert frames[-1].decode().split("\n")[1] == "event: done"


def test_the_openai_stream_sends_heartbeats_and_ends_a_stall_with_its_error_and_done() -> None:
    pipeline = _Pipeline(_waiting_then_answered(), heartbeat_s=0.1, stall_s=5)
    frames = asyncio.run(_collect(chat_stream(pipeline, _ctx(), model="docs")))  # type: ignore[arg-type]
    assert frames.count(HEARTBEAT) == 2
    assert frames[-1].endswith(b"data: [DONE]\n\n")
    content = "".join(
        (json.loads(f.decode().split("data: ", 1)[1])["choices"][0]["delta"].get("content") or "")
        for f in frames[:-1]
        if f != HEARTBEAT
    )
    assert content == "At 7:15."

    stalled = Script([(0.0, Event("1-0", Sources(sources=[SOURCE], index="docs")))], then_hang=True)
    pipeline = _Pipeline(stalled, heartbeat_s=0.1, stall_s=0.25)
    frames = asyncio.run(_collect(chat_stream(pipeline, _ctx(), model="docs")))  # type: ignore[arg-type]
    assert HEARTBEAT in frames
    error = json.loads(frames[-2].decode().split("data: ", 1)[1])["error"]
    assert error["code"] == "stalled" and "stalled" in error["message"]
    assert frames[-1].endswith(b"data: [DONE]\n\n")
    assert stalled.closed
