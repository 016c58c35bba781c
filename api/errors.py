"""The one place errors become responses: ``{error, message, request_id}`` with a 4xx/5xx status.

:func:`api_error` maps any exception to an :class:`ApiError`; everything that answers an error
goes through it: the framework's exception handlers, the fast path, an SSE stream that has to end
with an ``error`` event, and the outermost middleware's last resort. A Redis that fails in the
middle of a request is a 503 with Retry-After and a message that says so, never a 500 carrying
an exception's repr.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Scope

log = logging.getLogger(__name__)

# How soon a client may retry after Redis failed it: a restarting Redis is back within seconds.
REDIS_RETRY_AFTER_S = 1


class ApiError(Exception):
    def __init__(
        self, status: int, error: str, message: str, *, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message
        self.headers = headers or {}


def unavailable(message: str) -> ApiError:
    return ApiError(503, "unavailable", message, headers={"Retry-After": str(REDIS_RETRY_AFTER_S)})


def _describe(errors: list[dict[str, object]]) -> str:
    parts = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")  # type: ignore[union-attr]
        parts.append(f"{loc or 'body'}: {err.get('msg')}")
    return "; ".join(parts)


def invalid(errors: list[dict[str, object]]) -> ApiError:
    """A body that did not validate: 400 when it is not JSON at all, else 422 naming each field."""
    if any(e.get("type") == "json_invalid" for e in errors):
        return ApiError(400, "malformed_json", "request body is not valid JSON")
    return ApiError(422, "invalid_request", _describe(errors))


def api_error(exc: BaseException) -> ApiError:
    """What the client is told about ``exc``."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RequestValidationError | ValidationError):
        return invalid(list(exc.errors()))  # type: ignore[arg-type]
    if isinstance(exc, ClientDisconnect):  # nobody is left to read the answer
        return ApiError(499, "client_closed", "the client closed the request")
    if isinstance(exc, HTTPException):  # the framework's own: an unknown route, a wrong method
        error = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_")
        return ApiError(exc.status_code, error, str(exc.detail), headers=dict(exc.headers or {}))
    # Redis (or the task queue's own connection to it) failed or timed out: the request may
    # succeed in a moment, and nothing was accepted that could be lost.
    if isinstance(exc, redis.RedisError | ConnectionError | TimeoutError):
        log.warning("Redis failed a request: %r", exc)
        return unavailable("the service's Redis is not answering; retry shortly")
    log.error("unhandled error", exc_info=exc)
    return ApiError(500, "internal", "internal server error")


def error_body(error: ApiError, request_id: str | None) -> bytes:
    return json.dumps(
        {"error": error.error, "message": error.message, "request_id": request_id}, separators=(",", ":")
    ).encode()


def error_response(exc: BaseException, request_id: str | None) -> Response:
    error = api_error(exc)
    headers = dict(error.headers)
    if request_id:
        headers.setdefault("X-Request-Id", request_id)
    return Response(error_body(error, request_id), error.status, headers, media_type="application/json")


def request_id_of(scope: Scope) -> str | None:
    return scope.get("state", {}).get("request_id")


def install(app: FastAPI) -> None:
    async def handle(request: Request, exc: Exception) -> Response:
        return error_response(exc, request_id_of(request.scope))

    for kind in (ApiError, HTTPException, RequestValidationError, redis.RedisError):
        app.add_exception_handler(kind, handle)
