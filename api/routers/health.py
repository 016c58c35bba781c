"""Liveness and readiness probes, and the Prometheus metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from broker import liveness
from broker.keys import Keys
from broker.queues import QUEUES

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive and its event loop answers."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready when Redis answers and at least one live worker consumes each queue."""
    settings = request.app.state.settings
    redis = request.app.state.redis
    try:
        async with asyncio.timeout(settings.api.readyz_timeout_s):
            await redis.ping()
            workers = await liveness.live_counts(
                redis, Keys(settings.redis.key_prefix), QUEUES, settings.redis.worker_heartbeat_ttl_s
            )
    except Exception as exc:
        return JSONResponse({"ready": False, "redis": False, "reason": repr(exc)}, status_code=503)
    ready = all(workers.values())
    missing = [q for q, n in workers.items() if not n]
    body = {"ready": ready, "redis": True, "workers": workers}
    if missing:
        body["reason"] = "no live worker on " + ", ".join(missing)
    return JSONResponse(body, status_code=200 if ready else 503)
