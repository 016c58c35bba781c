"""Redis clients with bounded timeouts, one pool per process and URL."""

from __future__ import annotations

from functools import lru_cache

import redis
import redis.asyncio as aioredis

from broker.settings import RedisSettings


def _options(settings: RedisSettings) -> dict[str, object]:
    return {
        "socket_timeout": settings.redis_socket_timeout_s,
        "socket_connect_timeout": settings.redis_connect_timeout_s,
        "health_check_interval": 30,
        "decode_responses": False,
    }


@lru_cache(maxsize=8)
def _sync_pool(url: str, socket_timeout: float, connect_timeout: float) -> redis.ConnectionPool:
    return redis.ConnectionPool.from_url(
        url, socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout, health_check_interval=30
    )


def sync_client(settings: RedisSettings) -> redis.Redis:
    pool = _sync_pool(settings.redis_url, settings.redis_socket_timeout_s, settings.redis_connect_timeout_s)
    return redis.Redis(connection_pool=pool)


def async_client(settings: RedisSettings) -> aioredis.Redis:
    """A new asyncio client; the caller owns it (one per event loop)."""
    return aioredis.Redis.from_url(settings.redis_url, max_connections=512, **_options(settings))
