"""The cancel flag: set, seen, expires; the per-delta check asks Redis at most every ~100 ms."""

from __future__ import annotations

import asyncio
import time
import uuid

import redis
import redis.asyncio as aioredis

from broker.cancel import CancelCheck, arequest_cancel, is_cancelled, request_cancel
from broker.keys import Keys

KEYS = Keys("ragline-test-cancel")


class CountingClient:
    def __init__(self, inner: redis.Redis) -> None:
        self.inner = inner
        self.calls = 0

    def exists(self, key: str) -> int:
        self.calls += 1
        return self.inner.exists(key)


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


def test_check_is_rate_limited_and_sticky(redis_url: str) -> None:
    counting = CountingClient(redis.Redis.from_url(redis_url))
    rid = uuid.uuid4().hex
    check = CancelCheck(counting, KEYS, rid, every_s=0.1)  # type: ignore[arg-type]
    started = time.monotonic()
    while time.monotonic() - started < 0.35:
        assert not check()
    assert 3 <= counting.calls <= 5  # ~every 100 ms, not once per delta
    request_cancel(counting.inner, KEYS, rid, ttl_s=30)
    time.sleep(0.11)
    assert check()
    calls = counting.calls
    assert check() and counting.calls == calls  # once seen, no more round trips
