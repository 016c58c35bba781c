"""Worker heartbeats per queue, so readiness is one cheap Redis call instead of a broadcast."""

from __future__ import annotations

import time
from functools import cache

import redis
import redis.asyncio as aioredis
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.scripts import StateScript, lua

_BEAT = lua(__package__, "heartbeat")


@cache
def _beat_script(client: redis.Redis) -> StateScript:
    return StateScript(client, _BEAT)


def beat(client: redis.Redis, keys: Keys, queue: str, worker_id: str) -> None:
    _beat_script(client)(keys=[keys.workers(queue)], args=[time.time(), worker_id])


def leave(client: redis.Redis, keys: Keys, queue: str, worker_id: str) -> None:
    client.zrem(keys.workers(queue), worker_id)


def sync_live_counts(
    client: redis.Redis, keys: Keys, queues: tuple[str, ...], ttl_s: float
) -> dict[str, int]:
    """Live workers per queue, in one round trip: what a worker asks before it waits on others."""
    since = time.time() - ttl_s
    with client.pipeline(transaction=False) as pipe:
        for queue in queues:
            pipe.zcount(keys.workers(queue), since, "+inf")
        counts = pipe.execute()
    return dict(zip(queues, (int(c) for c in counts), strict=True))


async def live_counts(
    client: aioredis.Redis, keys: Keys, queues: tuple[str, ...], ttl_s: float
) -> dict[str, int]:
    since = time.time() - ttl_s
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.zcount(keys.workers(queue), since, "+inf")
    counts = await pipe.execute()
    return dict(zip(queues, (int(c) for c in counts), strict=True))
