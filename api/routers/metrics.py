"""Prometheus metrics of this API process (GET /metrics)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from broker import liveness, metrics, shards
from broker.backpressure import priority_lists
from broker.keys import Keys
from broker.queues import CALLBACKS_QUEUE, QUEUES

router = APIRouter(tags=["health"])


@router.get("/metrics", include_in_schema=False)
async def prometheus_metrics(request: Request) -> Response:
    settings = request.app.state.settings
    redis, keys = request.app.state.redis, Keys(settings.redis.key_prefix)
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
        pass
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
