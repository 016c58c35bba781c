"""The one place errors become responses: ``{error, message, request_id}`` with a 4xx/5xx status,
or, on the OpenAI-compatible paths (``/v1/chat/…``, ``/v1/models``), OpenAI's own shape
``{"error": {message, type, param, code}}``, with 400 for every request that is not valid (OpenAI's
clients expect it; the rest of the API says 422 for a body that is JSON but wrong); on ``/mcp``, a
JSON-RPC error (an MCP client shows its message, and reads no other body).

:func:`api_error` maps any exception to an :class:`ApiError`; everything that answers an error
goes through it: the framework's exception handlers, the fast path, an SSE stream that has to end
with an ``error`` event, and the outermost middleware's last resort. A Redis that fails in the
middle of a request is a 503 with Retry-After and a message that says so, never a 500 carrying
an exception's repr.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from ragline.broker import metrics
from ragline.broker.errors import RaglineError
from ragline.broker.limits.leases import CapReached
from ragline.broker.redis.durability import NotReplicated
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Scope

log = logging.getLogger(__name__)

# How soon a client may retry after Redis failed it: a restarting Redis is back within seconds.
REDIS_RETRY_AFTER_S = 1


# How soon a key past one of its caps may retry: a slot frees when any of its requests, streams
# or jobs ends, and which one ends first is not known here.
KEY_CAP_RETRY_AFTER_S = 1

# Paths whose errors take OpenAI's shape (its clients read nothing else).
OPENAI_PATHS = ("/v1/chat/", "/v1/models")
# The MCP endpoint (api/mcp/): its errors are JSON-RPC errors.
MCP_PATH = "/mcp"
# JSON-RPC's code for an error of the server's own (the range -32000 to -32099 is the server's).
_JSONRPC_SERVER_ERROR = -32000


class ApiError(RaglineError):
    def __init__(
        self,
        status: int,
        error: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message
        self.headers = headers or {}
        self.param = param  # the request field at fault, when one is (OpenAI's `param`)


def unavailable(message: str) -> ApiError:
    return ApiError(503, "unavailable", message, headers={"Retry-After": str(REDIS_RETRY_AFTER_S)})


def _describe(errors: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg')}")
    return "; ".join(parts)


def invalid(errors: Sequence[Mapping[str, Any]]) -> ApiError:
    """A body that did not validate: 400 when it is not JSON at all, else 422 naming each field."""
    if any(e.get("type") == "json_invalid" for e in errors):
        return ApiError(400, "malformed_json", "request body is not valid JSON")
    return ApiError(422, "invalid_request", _describe(errors), param=_field(errors))


def _field(errors: Sequence[Mapping[str, Any]]) -> str | None:
    """The top-level field of the first error (OpenAI's ``param``), if it names one."""
    loc = [p for p in errors[0].get("loc", ()) if p != "body"] if errors else []
    return str(loc[0]) if loc else None


def api_error(exc: BaseException) -> ApiError:
    """What the client is told about ``exc``."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RequestValidationError | ValidationError):
        return invalid(list(exc.errors()))
    if isinstance(exc, CapReached):  # the key holds all it may: other keys are still served
        metrics.REJECTIONS.labels("key_cap").inc()
        return ApiError(429, "key_cap", str(exc), headers={"Retry-After": str(KEY_CAP_RETRY_AFTER_S)})
    if isinstance(exc, ClientDisconnect):  # nobody is left to read the answer
        return ApiError(499, "client_closed", "the client closed the request")
    if isinstance(exc, HTTPException):  # the framework's own: an unknown route, a wrong method
        error = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_")
        return ApiError(exc.status_code, error, str(exc.detail), headers=dict(exc.headers or {}))
    # Only input can nest deep enough to exhaust the stack here (each parser the API uses has a
    # depth limit of its own; this is the one left for any that has not): the request is at fault.
    if isinstance(exc, RecursionError):
        log.warning("a request nested too deeply for a parser: %r", exc)
        return ApiError(400, "too_deep", "the request is nested too deeply to read")
    # A job's write reached no replica in time (RAGLINE_REDIS_WAIT_REPLICAS): it was undone, so
    # nothing was accepted; a failover in progress, or a replica behind, passes within seconds.
    if isinstance(exc, NotReplicated):
        metrics.REJECTIONS.labels("not_replicated").inc()
        log.warning("a durable write was not replicated: %s", exc)
        return unavailable("the job could not be stored on a Redis replica in time; retry shortly")
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


def openai_shaped(path: str) -> bool:
    return path.startswith(OPENAI_PATHS)


def openai_status(status: int) -> int:
    """OpenAI's status for ours: a request that is not valid is a 400 whatever was wrong with it."""
    return 400 if status == 422 else status


def _openai_type(status: int) -> str:
    if status >= 500:
        return "server_error"
    return {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}.get(
        status, "invalid_request_error"
    )


def openai_error(error: ApiError) -> dict[str, object]:
    """The error as OpenAI's ``{"error": {...}}`` (a response body, or a stream's last event)."""
    return {
        "error": {
            "message": error.message,
            "type": _openai_type(openai_status(error.status)),
            "param": error.param,
            "code": error.error,
        }
    }


def mcp_error(error: ApiError, request_id: str | None) -> dict[str, object]:
    """The error as a JSON-RPC error without an id (the request's was not read): its message says
    the status and why, its data has the fields of the API's own error body."""
    data = {"status": error.status, "error": error.error, "message": error.message, "request_id": request_id}
    message = f"{error.status} {error.error}: {error.message}"
    return {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": _JSONRPC_SERVER_ERROR, "message": message, "data": data},
    }


def error_response(exc: BaseException, request_id: str | None, *, path: str = "") -> Response:
    """The response for ``exc``, in OpenAI's shape on its paths (see :data:`OPENAI_PATHS`), as a
    JSON-RPC error on :data:`MCP_PATH`."""
    error = api_error(exc)
    headers = dict(error.headers)
    if request_id:
        headers.setdefault("X-Request-Id", request_id)
    if path == MCP_PATH:
        body = json.dumps(mcp_error(error, request_id), separators=(",", ":")).encode()
        return Response(body, error.status, headers, media_type="application/json")
    if openai_shaped(path):
        body = json.dumps(openai_error(error), separators=(",", ":")).encode()
        return Response(body, openai_status(error.status), headers, media_type="application/json")
    return Response(error_body(error, request_id), error.status, headers, media_type="application/json")


def request_id_of(scope: Scope) -> str | None:
    return scope.get("state", {}).get("request_id")


def install(app: FastAPI) -> None:
    async def handle(request: Request, exc: Exception) -> Response:
        return error_response(exc, request_id_of(request.scope), path=request.url.path)

    for kind in (
        ApiError,
        HTTPException,
        RequestValidationError,
        redis.RedisError,
        CapReached,
        NotReplicated,
    ):
        app.add_exception_handler(kind, handle)
