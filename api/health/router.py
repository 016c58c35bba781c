"""Liveness and readiness probes, and the Prometheus metrics."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from ragline.broker.config.settings import Settings
from ragline.broker.contract.queues import QUEUES
from ragline.broker.redis.keys import Keys
from ragline.broker.state import liveness, shards

router = APIRouter(tags=["health"])

# What the open paths read from Redis is read again at most this often, however often they are
# asked: they need no key and spend no token. A prober asks every few seconds; a second late
# costs it nothing.
PROBE_MAX_AGE_S = 1.0


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    details: dict[str, Any]  # why: Redis, the live workers of each queue and shard


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive and its event loop answers."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready (200) when Redis answers and at least one live worker consumes each queue, else 503:
    ``{"ready": ...}``, nothing more. With an admin key (or keys off), why: ``redis``, the live
    ``workers`` of each queue, the ``reason``, and for a sharded index its ``shards`` and the
    ``shards_without_worker`` (named, they leave the API ready: their queries answer from the
    other shards, and say they are partial)."""
    state: Readiness = await request.app.state.readiness.get()
    admin = await request.app.state.access.is_admin(request)
    body = state.details if admin else {"ready": state.ready}
    return JSONResponse(body, status_code=200 if state.ready else 503)


async def readiness(redis: aioredis.Redis, settings: Settings) -> Readiness:
    try:
        async with asyncio.timeout(settings.api.readyz_timeout_s):
            await redis.ping()
            keys = Keys(settings.redis.key_prefix)
            ttl_s = settings.redis.worker_heartbeat_ttl_s
            workers = await liveness.live_counts(redis, keys, QUEUES, ttl_s)
            by_queue = shards.shard_queues(await shards.alist(redis, keys))
            shard_workers = await liveness.live_counts(redis, keys, tuple(by_queue), ttl_s)
    except Exception as exc:
        return Readiness(False, {"ready": False, "redis": False, "reason": repr(exc)})
    ready = all(workers.values())
    missing = [q for q, n in workers.items() if not n]
    body: dict[str, Any] = {"ready": ready, "redis": True, "workers": workers}
    if missing:
        body["reason"] = "no live worker on " + ", ".join(missing)
    unserved = sorted(by_queue[q] for q, n in shard_workers.items() if not n)
    if by_queue:
        body["shards"] = {by_queue[q]: n for q, n in shard_workers.items()}
    if unserved:
        body["shards_without_worker"] = unserved
    return Readiness(ready, body)
