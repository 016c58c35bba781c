"""Cancelling a request (or job) in flight: a short-lived flag that the tasks look for.

``ragline:cancel:{id}`` outlives any task that could still run for the request (a redelivery
included). The generation worker's event batcher looks for it while it writes a request's tokens
(``broker/streams/event_batcher.py``), and the task stops its engine request; the retrieval task checks
it before it chains generation.
"""

from __future__ import annotations

import redis
import redis.asyncio as aioredis
from ragline.broker.redis.keys import Keys


def request_cancel(client: redis.Redis, keys: Keys, request_id: str, *, ttl_s: int) -> None:
    client.set(keys.cancel(request_id), b"1", ex=ttl_s)


async def arequest_cancel(client: aioredis.Redis, keys: Keys, request_id: str, *, ttl_s: int) -> None:
    await client.set(keys.cancel(request_id), b"1", ex=ttl_s)


def is_cancelled(client: redis.Redis, keys: Keys, request_id: str) -> bool:
    return bool(client.exists(keys.cancel(request_id)))
