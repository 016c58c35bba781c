"""Per-key leases on a real Redis: the cap across clients, release, expiry of a dead holder's."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis
import redis.asyncio as aioredis
from ragline.broker.limits.leases import REQUESTS, STREAMS, CapReached, Lease, Leases
from ragline.broker.redis.keys import Keys


def _keys() -> Keys:
    return Keys(f"ragline-test-{uuid.uuid4().hex[:8]}")


def _leases(redis_url: str, keys: Keys, *, ttl_s: float = 60.0) -> Leases:
    return Leases(aioredis.Redis.from_url(redis_url), keys, ttl_s=ttl_s, timeout_s=2.0)


def test_a_key_gets_its_cap_of_leases_then_cap_reached_and_other_keys_are_unaffected(
    redis_url: str,
) -> None:
    keys = _keys()

    async def go() -> None:
        # Two clients, as two API processes: the cap is the key's, wherever its requests land.
        first, second = _leases(redis_url, keys), _leases(redis_url, keys)
        held = [await first.acquire(STREAMS, "key_a", 3), await second.acquire(STREAMS, "key_a", 3)]
        held.append(await first.acquire(STREAMS, "key_a", 3))
        with pytest.raises(CapReached) as refused:
            await second.acquire(STREAMS, "key_a", 3)
        assert (refused.value.kind, refused.value.cap) == (STREAMS, 3)
        assert "key_max_streams" in str(refused.value)
        # Another key, and the same key's other kind, have caps of their own.
        await first.acquire(STREAMS, "key_b", 3)
        await first.acquire(REQUESTS, "key_a", 3)
        # A release frees one slot, once.
        await second.release(held[0])
        await second.release(held[0])
        await first.acquire(STREAMS, "key_a", 3)
        with pytest.raises(CapReached):
            await first.acquire(STREAMS, "key_a", 3)

    asyncio.run(go())


def test_concurrent_acquires_never_exceed_the_cap(redis_url: str) -> None:
    keys = _keys()

    async def go() -> list[Lease | BaseException]:
        clients = [_leases(redis_url, keys) for _ in range(4)]
        tries = [clients[i % 4].acquire(REQUESTS, "key_a", 10) for i in range(50)]
        return await asyncio.gather(*tries, return_exceptions=True)

    outcomes = asyncio.run(go())
    assert sum(isinstance(o, Lease) for o in outcomes) == 10
    assert all(isinstance(o, Lease | CapReached) for o in outcomes)
    assert redis.Redis.from_url(redis_url).zcard(keys.leases(REQUESTS, "key_a")) == 10


def test_a_lease_never_released_expires_on_its_own_and_so_does_its_set(redis_url: str) -> None:
    keys = _keys()
    sync = redis.Redis.from_url(redis_url)

    async def go() -> None:
        dead = _leases(redis_url, keys, ttl_s=0.3)  # a process that dies holding its leases
        await dead.acquire(STREAMS, "key_a", 2)
        await dead.acquire(STREAMS, "key_a", 2)
        with pytest.raises(CapReached):
            await dead.acquire(STREAMS, "key_a", 2)
        await asyncio.sleep(0.4)
        await _leases(redis_url, keys).acquire(STREAMS, "key_a", 2)  # its leases are gone

    asyncio.run(go())
    key = keys.leases(STREAMS, "key_a")
    assert sync.zcard(key) == 1 and 0 < sync.pttl(key) <= 60_000
    # Each lease is scored by its expiry in Redis's own clock, a TTL ahead.
    ((_, expiry),) = sync.zrange(key, 0, -1, withscores=True)
    seconds, micros = sync.time()
    assert 59_000 < expiry - (seconds * 1000 + micros / 1000) <= 60_000


def test_every_call_is_bounded(redis_url: str) -> None:
    # A Redis that does not answer (here: nothing listens) fails the call within its timeout.
    leases = Leases(
        aioredis.Redis.from_url("redis://10.255.255.1:6379/0", socket_connect_timeout=30),
        _keys(),
        ttl_s=60,
        timeout_s=0.3,
    )
    started = time.monotonic()
    with pytest.raises((TimeoutError, redis.RedisError, OSError)):
        asyncio.run(leases.acquire(REQUESTS, "key_a", 1))
    assert time.monotonic() - started < 2
