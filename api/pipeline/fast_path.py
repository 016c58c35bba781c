"""The fast path: ``POST /v1/query`` served below the framework, by the same pipeline.

A cache hit is one Redis round trip and a few microseconds of our own work; the framework's
exception middleware, routing, dependency solving and response handling around it cost more
than that. So this middleware, inside the door (request id, body limit, API key and rate limits
are applied), takes every ``POST /v1/query`` and does exactly what the route in
:mod:`ragline.api.query.router` does, with the same functions: the pipeline's validate step, the JSON
renderer (:func:`ragline.api.query.render.json_answer`), the one error mapping
(:func:`ragline.api.errors.error_response`).
It adds no decision of its own.
"""

from __future__ import annotations

from typing import Any

from ragline.api.errors import error_response
from ragline.api.pipeline import Pipeline
from ragline.api.query.protocol import QueryRequest
from ragline.api.query.render import json_answer
from starlette.types import ASGIApp, Message, Receive, Scope, Send

PATH = "/v1/query"


class FastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._route: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        scope["route"] = self._query_route(scope)  # what the request counter labels by
        state = scope["state"]
        pipeline: Pipeline = scope["app"].state.pipeline
        content_type = deadline_ms = None
        for name, value in scope["headers"]:
            if name == b"content-type" and content_type is None:
                content_type = value.decode("latin-1")
            elif name == b"x-request-deadline-ms" and deadline_ms is None:
                deadline_ms = value.decode("latin-1")
        body = await _body(receive)  # outside the try: a body over the limit is BodyLimit's 413
        if body is None:  # the client left before sending it all
            return
        try:
            ctx = pipeline.validate(
                body,
                request_id=state["request_id"],
                model=QueryRequest,
                content_type=content_type,
                deadline_ms=deadline_ms,
                single_flight=True,
                principal=state.get("principal", "anonymous"),
            )
            answer = await json_answer(pipeline, ctx)
        except Exception as exc:
            await error_response(exc, state["request_id"])(scope, receive, send)
            return
        state["answered_as"] = ctx.answered_as
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    def _query_route(self, scope: Scope) -> Any:
        if self._route is None:
            self._route = next(
                r
                for r in scope["app"].routes
                if getattr(r, "path", None) == PATH and "POST" in getattr(r, "methods", ())
            )
        return self._route


async def _body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    while True:
        message: Message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
