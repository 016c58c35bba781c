"""Every error leaves the API as JSON ``{error, message, request_id}`` with a 4xx/5xx status."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


class ApiError(Exception):
    def __init__(
        self, status: int, error: str, message: str, *, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message
        self.headers = headers or {}


def error_body(error: str, message: str, request_id: str | None) -> dict[str, str | None]:
    return {"error": error, "message": message, "request_id": request_id}


def _body(error: str, message: str, request: Request) -> dict[str, str | None]:
    return error_body(error, message, getattr(request.state, "request_id", None))


def _describe(errors: list[dict[str, object]]) -> str:
    parts = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")  # type: ignore[union-attr]
        parts.append(f"{loc or 'body'}: {err.get('msg')}")
    return "; ".join(parts)


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(
            _body(exc.error, exc.message, request), status_code=exc.status, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            return JSONResponse(
                _body("malformed_json", "request body is not valid JSON", request), status_code=400
            )
        return JSONResponse(_body("invalid_request", _describe(errors), request), status_code=422)
