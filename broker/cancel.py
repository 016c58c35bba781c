"""Cancelling a request (or job) in flight: a short-lived flag that the tasks look for.

``ragline:cancel:{id}`` outlives any task that could still run for the request (a redelivery
included). The generation task checks it between deltas, at most every ``every_s``, and stops
its engine request; the retrieval task checks it before it chains generation.
"""

from __future__ import annotations

import time

import redis
import redis.asyncio as aioredis

from broker.keys import Keys


def request_cancel(client: redis.Redis, keys: Keys, request_id: str, *, ttl_s: int) -> None:
    client.set(keys.cancel(request_id), b"1", ex=ttl_s)


async def arequest_cancel(client: aioredis.Redis, keys: Keys, request_id: str, *, ttl_s: int) -> None:
    await client.set(keys.cancel(request_id), b"1", ex=ttl_s)


def is_cancelled(client: redis.Redis, keys: Keys, request_id: str) -> bool:
    return bool(client.exists(keys.cancel(request_id)))


class CancelCheck:
    """``check()`` answers from Redis at most every ``every_s``: one EXISTS per ~100 ms per
    request, however fast the engine yields deltas. The first call always asks."""

    def __init__(self, client: redis.Redis, keys: Keys, request_id: str, *, every_s: float = 0.1) -> None:
        self._client = client
        self._key = keys.cancel(request_id)
        self._every_s = every_s
        self._next = 0.0
        self._cancelled = False

    def __call__(self) -> bool:
        now = time.monotonic()
        if not self._cancelled and now >= self._next:
            self._next = now + self._every_s
            try:
                self._cancelled = bool(self._client.exists(self._key))
            except redis.RedisError:
                # A Redis hiccup must not fail a generation that nobody cancelled.
                return False
        return self._cancelled
