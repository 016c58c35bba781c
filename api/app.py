"""The API app factory: ``uvicorn --factory api.app:create_app``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api import errors
from api.middleware import RequestContext
from api.routers import health, jobs, metrics, query
from api.serving import QueryService
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

    app.add_middleware(RequestContext, max_body_bytes=_MAX_BODY_BYTES)
    app.include_router(query.router)
    app.include_router(jobs.router)
    app.include_router(health.router)
    app.include_router(metrics.router)
    return app
