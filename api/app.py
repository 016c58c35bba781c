"""The API app factory: ``uvicorn --factory api.app:create_app``."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from api import errors
from api.routers import health, jobs, metrics, query
from api.serving import QueryService
from broker import metrics as prom
from broker.celery_app import create_celery
from broker.redis_pool import async_client
from broker.settings import Settings, get_settings

_MAX_BODY_BYTES = 64 * 1024


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.settings = settings
        app.state.redis = async_client(settings)
        app.state.query_service = QueryService(settings, app.state.redis, create_celery(settings))
        try:
            yield
        finally:
            app.state.query_service.close()
            await app.state.redis.aclose()

    app = FastAPI(
        title="ragline",
        version="0.1.0",
        summary="Grounded answers over your documents, under load.",
        lifespan=lifespan,
    )
    errors.install(app)

    @app.middleware("http")
    async def request_id_and_size(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        request.state.request_id = uuid.uuid4().hex
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > _MAX_BODY_BYTES:
            return JSONResponse(
                {
                    "error": "too_large",
                    "message": f"body over {_MAX_BODY_BYTES} bytes",
                    "request_id": request.state.request_id,
                },
                status_code=413,
            )
        response = await call_next(request)
        response.headers.setdefault("X-Request-Id", request.state.request_id)
        route = request.scope.get("route")
        # The route's template, not the raw path, keeps the label set bounded.
        prom.REQUESTS.labels(getattr(route, "path", "unmatched"), str(response.status_code)).inc()
        return response

    app.include_router(query.router)
    app.include_router(jobs.router)
    app.include_router(health.router)
    app.include_router(metrics.router)
    return app
