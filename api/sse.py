"""Server-sent events framing for the request's event stream, and the response that carries it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


def frame(event: str, data: str, *, event_id: str | None = None) -> bytes:
    """One SSE event whose ``data:`` is ``data``, a line of JSON (an event's encoding)."""
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {data}\n\n".encode()


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
