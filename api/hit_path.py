"""The cache-hit path: ``POST /v1/query`` answered from the result cache below the framework.

A hit is one Redis round trip and a few microseconds of our own work, but FastAPI's routing,
dependency solving and response handling around it cost more than that. This middleware sits
inside the door (request id, API key, rate limits are already applied) and answers a request
whose body validates and whose answer is cached. On a miss it hands the route what it learnt
(the admission decision and the lookup, which claimed the computation when admitted), so a miss
costs no second lookup. Anything else (a body that does not validate or is not JSON, a deadline
header, an unknown index, a Redis error) goes on to the route untouched, which answers it in full.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker import metrics

_PATH = "/v1/query"


class CachedAnswers:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self._route: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != _PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        messages, body = await _read_body(receive, self.max_body_bytes)
        replay = _replaying(messages, receive)
        if body is None or not _plain_json(scope["headers"]):
            await self.app(scope, replay, send)
            return
        service = scope["app"].state.query_service
        answer = await service.cached_answer(body, scope["state"]["request_id"])
        if not isinstance(answer, bytes):
            if answer is not None:
                scope["state"]["cache_probe"] = answer
            await self.app(scope, replay, send)
            return
        scope["route"] = self._query_route(scope)  # the request counter labels by route
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(answer)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": answer})
        metrics.REQUEST_SECONDS.labels(_PATH, "cached").observe(time.perf_counter() - started)

    def _query_route(self, scope: Scope) -> Any:
        if self._route is None:
            self._route = next(
                r
                for r in scope["app"].routes
                if getattr(r, "path", None) == _PATH and "POST" in getattr(r, "methods", ())
            )
        return self._route


def _plain_json(headers: list[tuple[bytes, bytes]]) -> bool:
    """A body the framework would read as JSON (a */json or */*+json content type, required) and
    no deadline header."""
    json_body = False
    for name, value in headers:
        if name == b"x-request-deadline-ms":
            return False
        if name == b"content-type":
            subtype = value.split(b";", 1)[0].strip().lower().partition(b"/")[2]
            json_body = subtype == b"json" or subtype.endswith(b"+json")
    return json_body


async def _read_body(receive: Receive, limit: int) -> tuple[list[Message], bytes | None]:
    """The messages read, and the whole body (None past ``limit`` or on a disconnect)."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        size += len(message.get("body", b""))
        if size > limit:
            return messages, None
        if not message.get("more_body", False):
            return messages, b"".join(m.get("body", b"") for m in messages)


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    """A receive that gives the already-read messages again, then the real ones."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
