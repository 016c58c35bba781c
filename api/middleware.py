"""Per-request context as plain ASGI middleware: a request id on every response, a body-size
bound, and the request counter. (Starlette's ``@app.middleware("http")`` wraps each response in
extra tasks and streams; on the cache-hit path that overhead was larger than the work itself.)"""

from __future__ import annotations

import json
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker import metrics


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
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", ()))
                if not any(name.lower() == b"x-request-id" for name, _ in headers):
                    headers.append(id_header)
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
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
