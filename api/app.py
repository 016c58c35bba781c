"""The API app factory: ``uvicorn --factory api.app:create_app``."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.asyncio as aioredis
from fastapi import FastAPI

from api import errors, middleware
from api.access import Access
from api.admission import Admission
from api.fast_path import FastPath
from api.pipeline.connect import Connected
from api.routers import chat, documents, health, indexes, jobs, metrics, query, web
from broker import shards
from broker.backpressure import BackpressureMonitor
from broker.celery_app import create_celery
from broker.keys import Keys
from broker.queues import QUEUES
from broker.ratelimit import Door
from broker.redis_pool import async_client
from broker.secret_policy import refuse_defaults
from broker.settings import Settings, get_settings

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
        app.state.access = Access(Door.of(app.state.redis, keys, api))
        connected = Connected(settings, app.state.redis, create_celery(settings.redis), app.state.admission)
        app.state.pipeline = connected.pipeline
        app.state.connected = connected
        # Everything built so far lives as long as the process: out of the collector's sight, a
        # full collection no longer walks it (tens of ms, paid by whichever request triggers it).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await app.state.monitor.stop()
            await connected.aclose()
            await app.state.redis.aclose()

    app = FastAPI(
        title="ragline",
        version="0.1.0",
        summary="Grounded answers over your documents, under load.",
        lifespan=lifespan,
    )
    errors.install(app)

    # The last added runs first: metrics, request id, body limit, the door, then the fast path.
    app.add_middleware(FastPath)
    app.add_middleware(middleware.Door)
    app.add_middleware(
        middleware.BodyLimit, max_body_bytes=_MAX_BODY_BYTES, upload_max_bytes=api.upload_max_bytes
    )
    app.add_middleware(middleware.RequestId)
    app.add_middleware(middleware.Metrics)
    app.include_router(query.router)
    app.include_router(chat.router)
    app.include_router(jobs.router)
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(indexes.router)
    app.include_router(documents.router)
    app.include_router(web.router)
    return app
