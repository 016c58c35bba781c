"""Server-sent events framing for the request's event stream."""

from __future__ import annotations


def frame(event: str, data: str, *, event_id: str | None = None) -> bytes:
    """One SSE event whose ``data:`` is ``data``, a line of JSON (an event's encoding)."""
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {data}\n\n".encode()
