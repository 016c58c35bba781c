"""The cross-cutting concerns, each one small ASGI middleware (outermost first):

- :class:`Metrics`: the request counter (requests refused before routing count as ``refused``),
  and the one place request latency is recorded. Outermost, so it sees every response, the last
  resort's too.
- :class:`RequestId`: an id for every request, ``X-Request-Id`` on every response, and the last
  resort: an exception nothing else answered becomes the error mapping's response.
- :class:`BodyLimit`: 413 past the limit, for a body whose ``Content-Length`` says so at once,
  for one sent in chunks as soon as the bytes that arrived pass it.
- :class:`AuthAndRateLimit`: the API key (401) and rate limits (429), one Redis round trip,
  touching no queue.

Plain ASGI rather than Starlette's ``@app.middleware``, which wraps each response in extra tasks
and streams: on the cache-hit path that overhead was larger than the work itself.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

from ragline.api.access import Refusal, rate_headers
from ragline.api.errors import ApiError, error_response
from ragline.broker import metrics
from ragline.broker.errors import RaglineError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

Headers = list[tuple[bytes, bytes]]


def _with_headers(headers: Headers, extra: Headers) -> Headers:
    """``headers`` and those of ``extra`` the app did not set itself."""
    present = {name.lower() for name, _ in headers}
    return headers + [(name, value) for name, value in extra if name not in present]


def _adding_headers(send: Send, extra: Headers) -> Send:
    """``send`` with ``extra`` headers on the response start."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = _with_headers(list(message.get("headers", ())), extra)
        await send(message)

    return sending


class _Http:
    """A middleware for HTTP requests: each passes anything else (the lifespan) straight on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app


class RequestId(_Http):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        extra = [(b"x-request-id", request_id.encode())]
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = _with_headers(list(message.get("headers", ())), extra)
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            if started:
                raise
            await error_response(exc, request_id, path=scope["path"])(scope, receive, sending)


class Metrics(_Http):
    """``ragline_requests_total`` by route and status, for every request; and, for every query the
    pipeline answered, ``ragline_request_seconds`` by route and how it was answered (``cached``,
    ``rag``, ``retrieval``, ``job``), from the door to the response's last byte (a stream's last
    event)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        began = time.perf_counter()
        status = 499  # unless a response starts: the client left before one could

        async def recording(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording)
        finally:
            state = scope.get("state", {})
            route: Any = scope.get("route")
            # The route's template, not the raw path, keeps the label set bounded.
            endpoint = getattr(route, "path", None) or ("refused" if state.get("refused") else "unmatched")
            metrics.REQUESTS.labels(endpoint, str(status)).inc()
            answered_as = state.get("answered_as")
            if answered_as is not None and status < 400:
                metrics.REQUEST_SECONDS.labels(endpoint, answered_as).observe(time.perf_counter() - began)


class BodyTooLarge(RaglineError):
    """Raised into the app by :class:`BodyLimit` when a body passes the limit."""


# Uploads (POST /v1/indexes/{name}/documents) have a limit of their own.
_UPLOAD_PATH = re.compile(r"/v1/indexes/[^/]+/documents")


class BodyLimit(_Http):
    def __init__(self, app: ASGIApp, *, max_body_bytes: int, upload_max_bytes: int | None = None) -> None:
        super().__init__(app)
        self.max_body_bytes = max_body_bytes
        self.upload_max_bytes = upload_max_bytes or max_body_bytes

    def limit_for(self, scope: Scope) -> int:
        if scope.get("method") == "POST" and _UPLOAD_PATH.fullmatch(scope.get("path", "")):
            return self.upload_max_bytes
        return self.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limit_for(scope)
        length, chunked = None, False
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = True
        if length is not None and not chunked:
            # The server reads no more than Content-Length says: nothing to count.
            if length.isdigit() and int(length) > limit:
                scope["state"]["refused"] = True
                await self._too_large(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        received = 0
        tripped = False

        async def counting() -> Message:
            nonlocal received, tripped
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    tripped = True
                    raise BodyTooLarge
            return message

        async def unless_tripped(message: Message) -> None:
            if not tripped:  # the app's own answer to the exception is replaced by the 413
                await send(message)

        try:
            await self.app(scope, counting, unless_tripped)
        except Exception:
            if not tripped:
                raise
        if tripped:
            await self._too_large(scope, receive, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        too_large = ApiError(413, "too_large", f"body over {self.limit_for(scope)} bytes")
        await error_response(too_large, scope["state"]["request_id"], path=scope["path"])(
            scope, receive, send
        )


class AuthAndRateLimit(_Http):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = scope["state"]
        verdict = await scope["app"].state.access.check(Request(scope))
        if isinstance(verdict, Refusal):
            state["refused"] = True
            refused = ApiError(verdict.status, verdict.error, verdict.message, headers=verdict.headers)
            await error_response(refused, state["request_id"], path=scope["path"])(scope, receive, send)
            return
        if verdict.principal != "anonymous" or "principal" not in state:
            # With auth off, a principal set by an outer layer (a trusted gateway, a test) stays.
            state["principal"] = verdict.principal
        state["scopes"] = verdict.scopes
        extra = [(k.lower().encode(), v.encode()) for k, v in rate_headers(verdict).items()]
        await self.app(scope, receive, _adding_headers(send, extra) if extra else send)
