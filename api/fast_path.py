"""The fast path: a plain ``POST /v1/query`` answered below the framework.

A hit is one Redis round trip and a few microseconds of our own work, but FastAPI's routing,
dependency solving and response handling around it cost more than that; on a miss they cost
about as much as the API's own part of the work. This middleware sits inside the door (request
id, API key, rate limits are already applied) and answers a request whose body validates: from
the cache, or on a miss from what the lookup learnt (the admission decision, and the claim on
the computation when admitted), so a request is looked up once. Its errors have the route's
shape. Anything else (a body that does not validate or is not JSON, a malformed deadline
header, an unknown index, a Redis error at lookup) goes on to the route untouched, which
answers it in full.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import ApiError, error_body
from api.serving import Probe
from broker import metrics

_PATH = "/v1/query"


class FastPath:
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
        plain, deadline_ms = _plain_json(scope["headers"])
        if body is None or not plain:
            await self.app(scope, replay, send)
            return
        service = scope["app"].state.query_service
        request_id = scope["state"]["request_id"]
        answer = await service.cached_answer(body, request_id, deadline_ms=deadline_ms)
        if answer is None:
            await self.app(scope, replay, send)
            return
        scope["route"] = self._query_route(scope)  # the request counter labels by route
        label = "cached"
        if isinstance(answer, Probe):
            label = answer.admitted.mode
            try:
                computed = await service.answer_probed(request_id, answer)
            except ApiError as exc:
                refusal = error_body(exc.error, exc.message, request_id)
                await JSONResponse(refusal, status_code=exc.status, headers=exc.headers)(scope, replay, send)
                return
            answer = computed if isinstance(computed, bytes) else computed.model_dump_json().encode()
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
        metrics.REQUEST_SECONDS.labels(_PATH, label).observe(time.perf_counter() - started)

    def _query_route(self, scope: Scope) -> Any:
        if self._route is None:
            self._route = next(
                r
                for r in scope["app"].routes
                if getattr(r, "path", None) == _PATH and "POST" in getattr(r, "methods", ())
            )
        return self._route


_NOT_PLAIN = (False, None)


def _plain_json(headers: list[tuple[bytes, bytes]]) -> tuple[bool, int | None]:
    """Whether the framework would read the body as JSON (a */json or */*+json content type,
    required), and the deadline header's value; not plain when that header is anything but one
    positive integer (the route answers it, with a 422 where it is invalid)."""
    json_body, deadline_ms = False, None
    for name, value in headers:
        if name == b"x-request-deadline-ms":
            if deadline_ms is not None or not value.isdigit() or int(value) < 1:
                return _NOT_PLAIN
            deadline_ms = int(value)
        elif name == b"content-type":
            subtype = value.split(b";", 1)[0].strip().lower().partition(b"/")[2]
            json_body = subtype == b"json" or subtype.endswith(b"+json")
    return json_body, deadline_ms


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
