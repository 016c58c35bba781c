"""The root of each request's trace: one ASGI middleware, outermost, installed (and this module
imported) only when this process traces (``create_app``): a process that does not trace pays
nothing for it.

Its server span lasts from the door to the response's last byte (a stream's last event), and is
current while the app runs: the pipeline's steps (``api/pipeline/steps.py``) nest in it, and
through the task headers so do the workers' spans. A caller that sends ``traceparent`` gets its
trace continued. The span is named by the route's template (``POST /v1/query``) and carries the
request id that ``X-Request-Id`` returns, to find a request's trace by it.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import SpanKind, StatusCode
from ragline.broker.tracing import propagation, tracer
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class Tracing:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        traces = tracer()
        if traces is None or scope["type"] != "http":  # tracing stopped (the app is stopping)
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with traces.start_as_current_span(
            method,
            context=propagation.http_context(scope["headers"]),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": scope["path"]},
        ) as span:
            try:
                await self.app(scope, receive, sending)
            finally:
                state: dict[str, Any] = scope.get("state", {})
                template = getattr(scope.get("route"), "path", None)
                if template:
                    span.update_name(f"{method} {template}")
                    span.set_attribute("http.route", template)
                if "request_id" in state:
                    span.set_attribute("ragline.request_id", state["request_id"])
                if "answered_as" in state:
                    span.set_attribute("ragline.answered_as", state["answered_as"])
                # No response started: the client left first (Metrics counts it as 499 too).
                span.set_attribute("http.response.status_code", status or 499)
                if status >= 500:
                    span.set_status(StatusCode.ERROR)
