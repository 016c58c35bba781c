"""Liveness and readiness probes, and the Prometheus metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from broker import liveness, shards
from broker.keys import Keys
from broker.queues import QUEUES

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive and its event loop answers."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready when Redis answers and at least one live worker consumes each queue. A shard of a
    sharded index with no live worker is named (``shards_without_worker``) but leaves the API
    ready: its queries still answer, from the other shards, and say they are partial."""
    settings = request.app.state.settings
    redis = request.app.state.redis
    try:
        async with asyncio.timeout(settings.api.readyz_timeout_s):
            await redis.ping()
            keys = Keys(settings.redis.key_prefix)
            ttl_s = settings.redis.worker_heartbeat_ttl_s
            workers = await liveness.live_counts(redis, keys, QUEUES, ttl_s)
            by_queue = shards.shard_queues(await shards.alist(redis, keys))
            shard_workers = await liveness.live_counts(redis, keys, tuple(by_queue), ttl_s)
    except Exception as exc:
        return JSONResponse({"ready": False, "redis": False, "reason": repr(exc)}, status_code=503)
    ready = all(workers.values())
    missing = [q for q, n in workers.items() if not n]
    body = {"ready": ready, "redis": True, "workers": workers}
    if missing:
        body["reason"] = "no live worker on " + ", ".join(missing)
    unserved = sorted(by_queue[q] for q, n in shard_workers.items() if not n)
    if by_queue:
        body["shards"] = {by_queue[q]: n for q, n in shard_workers.items()}
    if unserved:
        body["shards_without_worker"] = unserved
    return JSONResponse(body, status_code=200 if ready else 503)
