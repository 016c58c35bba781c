"""Prometheus metrics of this API process (GET /metrics)."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from ragline.broker import metrics
from ragline.broker.config.settings import Settings
from ragline.broker.contract.queues import CALLBACKS_QUEUE, QUEUES
from ragline.broker.limits.backpressure import priority_lists
from ragline.broker.redis.keys import Keys
from ragline.broker.state import liveness, shards

router = APIRouter(tags=["health"])


@router.get("/metrics", include_in_schema=False)
async def prometheus_metrics(request: Request) -> Response:
    await request.app.state.worker_gauges.get()
    # As admission sees them now (no Redis call): what GET /v1/health/queues answers.
    for queue in request.app.state.admission.view().queues:
        metrics.QUEUE_PREDICTED_WAIT.labels(queue.queue).set(queue.predicted_wait_s)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


async def refresh_worker_gauges(redis: aioredis.Redis, settings: Settings) -> bool:
    """The live workers of each queue and the waiting tasks of each shard's, read from Redis into
    the gauges (False when Redis did not answer: they keep their last values)."""
    keys = Keys(settings.redis.key_prefix)
    try:
        async with asyncio.timeout(1.0):
            # Shards registered since the backpressure monitor started are measured here.
            shard_queues = tuple(shards.shard_queues(await shards.alist(redis, keys)))
            queues = (*QUEUES, CALLBACKS_QUEUE, *shard_queues)
            counts = await liveness.live_counts(redis, keys, queues, settings.redis.worker_heartbeat_ttl_s)
            pipe = redis.pipeline(transaction=False)
            for queue in shard_queues:
                for name in priority_lists(queue):
                    pipe.llen(name)
            lengths = iter(await pipe.execute())
        for queue, n in counts.items():
            metrics.LIVE_WORKERS.labels(queue).set(n)
        for queue in shard_queues:
            waiting = sum(next(lengths) for _ in priority_lists(queue))
            metrics.SHARD_QUEUE_WAITING.labels(queue).set(waiting)
    except Exception:
        return False
    return True
