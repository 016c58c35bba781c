"""Server-sent events framing for the request's event stream, the pacing that keeps a quiet stream
alive (and ends a stalled one), and the response that carries it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import TypeVar

from fastapi.responses import StreamingResponse
from ragline.api.errors import ApiError
from ragline.broker import metrics
from starlette.types import Receive, Scope, Send

T = TypeVar("T")

# A comment line: every SSE client skips it (the spec's own keep-alive), OpenAI's and ours included.
HEARTBEAT = b": heartbeat\n\n"


def frame(event: str, data: str, *, event_id: str | None = None) -> bytes:
    """One SSE event whose ``data:`` is ``data``, a line of JSON (an event's encoding)."""
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {data}\n\n".encode()


class StreamStalled(ApiError):
    """Nothing new came for the stream's stall limit: it ends with an error saying so."""

    def __init__(self, stall_s: float) -> None:
        super().__init__(504, "stalled", f"stream stalled: nothing new for {stall_s:g} s")


async def paced(
    items: AsyncGenerator[T, None], *, heartbeat_s: float, stall_s: float
) -> AsyncGenerator[T | None, None]:
    """``items`` as they come, and None each time ``heartbeat_s`` pass with nothing sent (the caller
    sends :data:`HEARTBEAT` for it); raises :class:`StreamStalled` once ``stall_s`` pass without
    a new item.

    Heartbeats keep proxies and load balancers, whose idle timeouts (often 60 s) would otherwise
    cut a stream whose request waits in a queue, from seeing it idle; the stall limit then bounds
    what their timeout used to: how long a stream whose work stopped stays open.

    ``items`` is read by a task of its own through a one-place queue, since waiting on a
    generator's next item with a timeout would cancel it (and so end it) at the first heartbeat;
    the task is cancelled, and ``items`` closed, when this generator is closed or ends.
    """
    handoff: asyncio.Queue[tuple[T] | Exception | None] = asyncio.Queue(maxsize=1)

    async def read() -> None:
        try:
            async with contextlib.aclosing(items):
                async for item in items:
                    await handoff.put((item,))
        except Exception as exc:
            await handoff.put(exc)
        else:
            await handoff.put(None)

    reader = asyncio.create_task(read(), name="sse-reader")
    loop = asyncio.get_running_loop()
    last_new = loop.time()
    try:
        while True:
            quiet_s = loop.time() - last_new
            if quiet_s >= stall_s:
                metrics.STREAM_STALLS.inc()
                raise StreamStalled(stall_s)
            try:
                async with asyncio.timeout(min(heartbeat_s, stall_s - quiet_s)):
                    got = await handoff.get()
            except TimeoutError:
                if loop.time() - last_new < stall_s:
                    yield None
                continue
            if got is None:
                return
            if isinstance(got, Exception):
                raise got
            last_new = loop.time()
            yield got[0]
    finally:
        reader.cancel()
        # Waited for, not awaited: its cancellation is its own, and must not be taken for this
        # generator's (a cancelled caller's CancelledError still goes through).
        await asyncio.wait({reader})


class EventStream(StreamingResponse):
    """A ``text/event-stream`` response that calls ``on_close`` once it is over, however it ends:
    sent whole, cut off by the client, or never begun (a generator that never started runs no
    ``finally`` of its own, so what the stream holds is let go here too)."""

    def __init__(
        self, content: AsyncIterator[bytes], *, on_close: Callable[[], None], headers: Mapping[str, str]
    ) -> None:
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
