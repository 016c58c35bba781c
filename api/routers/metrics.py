"""Prometheus metrics of this API process (GET /metrics)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from broker import liveness, metrics
from broker.keys import Keys
from broker.queues import CALLBACKS_QUEUE, QUEUES

router = APIRouter(tags=["health"])


@router.get("/metrics", include_in_schema=False)
async def prometheus_metrics(request: Request) -> Response:
    settings = request.app.state.settings
    queues = (*QUEUES, CALLBACKS_QUEUE)
    try:
        async with asyncio.timeout(1.0):
            counts = await liveness.live_counts(
                request.app.state.redis,
                Keys(settings.redis.key_prefix),
                queues,
                settings.redis.worker_heartbeat_ttl_s,
            )
        for queue, n in counts.items():
            metrics.LIVE_WORKERS.labels(queue).set(n)
    except Exception:
        pass
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
