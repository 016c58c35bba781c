"""The API app factory: ``uvicorn --factory ragline.api.app:create_app``."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.asyncio as aioredis
from fastapi import FastAPI
from ragline.api import errors, middleware
from ragline.api.access import Access
from ragline.api.browser_guard import BrowserGuard
from ragline.api.chat import router as chat
from ragline.api.documents import router as documents
from ragline.api.documents.service import DocumentService
from ragline.api.health import metrics, queues
from ragline.api.health import router as health
from ragline.api.health.recent import Recent
from ragline.api.indexes import router as indexes
from ragline.api.jobs import router as jobs
from ragline.api.jobs.service import JobService
from ragline.api.mcp import router as mcp
from ragline.api.pipeline.admission import Admission
from ragline.api.pipeline.connect import PipelineResources
from ragline.api.pipeline.fast_path import FastPath
from ragline.api.query import router as query
from ragline.api.web import docs
from ragline.api.web import router as web
from ragline.broker import tracing
from ragline.broker.celery_app import create_celery
from ragline.broker.config.secret_policy import refuse_defaults
from ragline.broker.config.settings import Settings, get_settings
from ragline.broker.contract.queues import QUEUES
from ragline.broker.limits.backpressure import BackpressureMonitor
from ragline.broker.limits.ratelimit import AuthRateLimiter
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.pool import async_client
from ragline.broker.state import shards

log = logging.getLogger("ragline.api")

_MAX_BODY_BYTES = 64 * 1024


async def _shard_queues(redis: aioredis.Redis, keys: Keys) -> tuple[str, ...]:
    """The queues of the shards registered now, measured with the others (depth, rate, workers);
    admission reads only the batch and generation queues."""
    try:
        async with asyncio.timeout(2.0):
            return tuple(shards.shard_queues(await shards.alist(redis, keys)))
    except Exception:
        log.warning("no shard list from Redis at start: shard queues are left out of backpressure")
        return ()


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    refuse_defaults(settings, "api")  # never on the public development webhook secret
    keys = Keys(settings.redis.key_prefix)
    api = settings.api
    traced = tracing.configure(settings.telemetry, "ragline-api")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not api.auth_enabled:
            log.warning(
                "RAGLINE_AUTH_ENABLED is false: every request is served without an API key. "
                "For a local demo only; never expose this API."
            )
        app.state.settings = settings
        app.state.redis = async_client(settings.redis)
        app.state.monitor = BackpressureMonitor(
            app.state.redis,
            keys,
            (*QUEUES, *await _shard_queues(app.state.redis, keys)),
            refresh_s=api.backpressure_refresh_ms / 1000,
            tau_s=api.service_rate_tau_s,
            heartbeat_ttl_s=settings.redis.worker_heartbeat_ttl_s,
        )
        app.state.monitor.start()
        app.state.admission = Admission(api, app.state.monitor)
        app.state.access = Access(AuthRateLimiter.of(app.state.redis, keys, api))
        # Open paths: what they read from Redis, read at most once a second whoever asks.
        app.state.readiness = Recent(
            functools.partial(health.readiness, app.state.redis, settings), max_age_s=health.PROBE_MAX_AGE_S
        )
        app.state.worker_gauges = Recent(
            functools.partial(metrics.refresh_worker_gauges, app.state.redis, settings),
            max_age_s=health.PROBE_MAX_AGE_S,
        )
        resources = PipelineResources(
            settings, app.state.redis, create_celery(settings.redis), app.state.admission
        )
        app.state.pipeline = resources.pipeline
        app.state.pipeline_resources = resources
        app.state.job_service = JobService(
            settings.jobs, settings.webhooks, settings.redis, app.state.redis, resources.pipeline
        )
        app.state.document_service = DocumentService(
            api,
            settings.webhooks,
            settings.redis,
            settings.jobs,
            uploads_dir=settings.uploads_dir,
            redis=app.state.redis,
            send=resources.send,
            retrieval=settings.retrieval,
        )
        # Everything built so far lives as long as the process: out of the collector's sight, a
        # full collection no longer walks it (tens of ms, paid by whichever request triggers it).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await app.state.monitor.stop()
            await resources.aclose()
            await app.state.redis.aclose()
            if traced:
                tracing.shutdown()  # exports the spans still buffered

    app = FastAPI(
        title="ragline",
        version="0.1.0",
        summary="Grounded answers over your documents, under load.",
        lifespan=lifespan,
        # Served by api/web/docs.py, on packaged scripts rather than FastAPI's CDN.
        docs_url=None,
        redoc_url=None,
    )
    errors.install(app)

    # The last added runs first: metrics, request id, the browser guard, body limit, API key and
    # rate limits, then the fast path.
    app.add_middleware(FastPath)
    app.add_middleware(middleware.AuthAndRateLimit)
    app.add_middleware(
        middleware.BodyLimit, max_body_bytes=_MAX_BODY_BYTES, upload_max_bytes=api.upload_max_bytes
    )
    app.add_middleware(BrowserGuard, allowed_hosts=api.allowed_hosts, bound_address=api.api_host)
    app.add_middleware(middleware.RequestId)
    app.add_middleware(middleware.Metrics)
    if traced:
        from ragline.api.tracing import Tracing  # only when tracing: it loads the tracing SDK

        app.add_middleware(Tracing)  # outermost: each request's trace holds everything done for it
    app.include_router(query.router)
    app.include_router(chat.router)
    app.include_router(jobs.router)
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(queues.router)
    app.include_router(indexes.router)
    app.include_router(documents.router)
    app.include_router(web.router)
    app.include_router(docs.router)
    app.include_router(mcp.router())
    return app
