"""Caches give way first: the guard reads Redis' own memory figures (a real, limited Redis)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from ragline.broker.redis.memory_guard import AsyncMemoryGuard, MemoryGuard

from tests.helpers import fill_to, redis_server


@pytest.mark.redis  # a redis-server of its own
def test_writes_stop_past_the_share_of_maxmemory(tmp_path: Path) -> None:
    with redis_server(tmp_path, maxmemory="8mb") as client:
        fill_to(client, 0.5)
        assert MemoryGuard(client, "t", max_fraction=0.7).allows_write()
        fill_to(client, 0.75)
        assert not MemoryGuard(client, "t", max_fraction=0.7).allows_write()
        assert MemoryGuard(client, "t", max_fraction=0.9).allows_write()
        assert MemoryGuard(client, "t", max_fraction=1.0).allows_write()  # off

        async def guarded(fraction: float) -> bool:
            port = client.connection_pool.connection_kwargs["port"]
            async_client = aioredis.Redis(port=port)
            try:
                return await AsyncMemoryGuard(async_client, "t", max_fraction=fraction).allows_write()
            finally:
                await async_client.aclose()

        assert not asyncio.run(guarded(0.7)) and asyncio.run(guarded(0.9))


@pytest.mark.redis  # a redis-server of its own
def test_no_maxmemory_means_room_and_an_oom_means_none_until_the_next_reading(tmp_path: Path) -> None:
    with redis_server(tmp_path) as client:
        guard = MemoryGuard(client, "t", max_fraction=0.7, refresh_s=3600)
        assert guard.allows_write()
        guard.dropped("oom")  # Redis refused a write after all
        assert not guard.allows_write()


@pytest.mark.slow  # redis-py's connection retries back off for seconds
def test_an_unreachable_redis_keeps_the_last_answer() -> None:
    dead = redis.Redis(port=1, socket_connect_timeout=0.2)
    assert MemoryGuard(dead, "t", max_fraction=0.7).allows_write()
