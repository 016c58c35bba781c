"""The door, as plain ASGI middleware. In order: a request id (on every response), the body-size
bound (413), the API key (401) and rate limits (429), none of which touches a queue; then the
request counter and the rate-limit headers on the way out. (Starlette's ``@app.middleware``
wraps each response in extra tasks and streams; on the cache-hit path that overhead was larger
than the work itself.)"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.access import Refusal, rate_headers, refusal_response
from broker import metrics

log = logging.getLogger(__name__)


class RequestContext:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        id_header = (b"x-request-id", request_id.encode())
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
                await self._too_large(send, request_id, id_header)
                return
        verdict = await scope["app"].state.access.check(Request(scope))
        if isinstance(verdict, Refusal):
            await refusal_response(verdict, request_id)(scope, receive, send)
            metrics.REQUESTS.labels("refused", str(verdict.status)).inc()
            return
        if verdict.principal != "anonymous" or "principal" not in scope["state"]:
            # With auth off, a principal set by an outer layer (a trusted gateway, a test) stays.
            scope["state"]["principal"] = verdict.principal
        extra = [(b"x-request-id", request_id.encode())]
        extra += [(k.lower().encode(), v.encode()) for k, v in rate_headers(verdict).items()]
        status = 500
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                headers = list(message.get("headers", ()))
                present = {name.lower() for name, _ in headers}
                headers += [(name, value) for name, value in extra if name not in present]
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            body = {"error": "internal", "message": "internal server error", "request_id": request_id}
            await JSONResponse(body, status_code=500)(scope, receive, send_with_id)
        finally:
            route: Any = scope.get("route")
            # The route's template, not the raw path, keeps the label set bounded.
            metrics.REQUESTS.labels(getattr(route, "path", "unmatched"), str(status)).inc()

    async def _too_large(self, send: Send, request_id: str, id_header: tuple[bytes, bytes]) -> None:
        body = json.dumps(
            {
                "error": "too_large",
                "message": f"body over {self.max_body_bytes} bytes",
                "request_id": request_id,
            }
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            id_header,
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
