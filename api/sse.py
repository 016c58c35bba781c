"""Server-sent events framing for the request's event stream."""

from __future__ import annotations

import json
from typing import Any


def frame(event: str, data: dict[str, Any], *, event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
