"""The cancel flag: set (sync or async), seen, expires."""

from __future__ import annotations

import asyncio
import uuid

import redis
import redis.asyncio as aioredis
from ragline.broker.redis.keys import Keys
from ragline.broker.streams.cancel import arequest_cancel, is_cancelled, request_cancel

KEYS = Keys("ragline-test-cancel")


def test_flag_is_set_seen_and_expires(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    rid = uuid.uuid4().hex
    assert not is_cancelled(client, KEYS, rid)
    request_cancel(client, KEYS, rid, ttl_s=30)
    assert is_cancelled(client, KEYS, rid)
    assert 0 < client.ttl(KEYS.cancel(rid)) <= 30

    other = uuid.uuid4().hex

    async def cancel_async() -> None:
        aclient = aioredis.Redis.from_url(redis_url)
        try:
            await arequest_cancel(aclient, KEYS, other, ttl_s=30)
        finally:
            await aclient.aclose()

    asyncio.run(cancel_async())
    assert is_cancelled(client, KEYS, other)
