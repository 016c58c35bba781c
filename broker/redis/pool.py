"""Redis clients with bounded timeouts, one pool per process and URL, for one Redis or a Sentinel
set's primary (:mod:`ragline.broker.redis.target`).

A Sentinel-managed connection asks the sentinels where the primary is each time it connects,
and drops itself when the server it holds turns out to be a replica (a failover demoted it).
What fails in the switch is a connection error: every client here retries those, with a backoff
whose sleeps add up to no more than the call's socket timeout, so a failover that completes
within that time costs a request a delay, not an error. Timeouts are not retried (a command
that timed out may have run; and a retry would multiply the bound every caller relies on).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import redis
import redis.asyncio as aioredis
from ragline.broker.config.settings import RedisSettings
from ragline.broker.redis.target import RedisTarget, parse
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

# The first retry is almost at once (a connection the old primary closed), later ones wait for
# the sentinels to promote a replica.
_BACKOFF_BASE_S = 0.05
_BACKOFF_CAP_S = 1.0
_HEALTH_CHECK_S = 30


def retries_within(budget_s: float, *, base_s: float = _BACKOFF_BASE_S, cap_s: float = _BACKOFF_CAP_S) -> int:
    """How many retries fit in ``budget_s`` of backoff (redis-py's ExponentialBackoff's sleeps)."""
    backoff = ExponentialBackoff(cap=cap_s, base=base_s)
    slept, retries = 0.0, 0
    while retries < 64:
        step = backoff.compute(retries + 1)
        if slept + step > budget_s + 1e-9:
            break
        slept += step
        retries += 1
    return retries


def _retry_args(budget_s: float) -> tuple[ExponentialBackoff, int, tuple[type[Exception], ...]]:
    return (
        ExponentialBackoff(cap=_BACKOFF_CAP_S, base=_BACKOFF_BASE_S),
        retries_within(budget_s),
        (redis.ConnectionError,),
    )


def sync_retry(budget_s: float) -> Retry:
    backoff, retries, errors = _retry_args(budget_s)
    return Retry(backoff, retries, supported_errors=errors)


def async_retry(budget_s: float) -> AsyncRetry:
    backoff, retries, errors = _retry_args(budget_s)
    return AsyncRetry(backoff, retries, supported_errors=errors)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where to connect and the bounds of every call: the pool cache's key."""

    url: str
    socket_timeout_s: float
    connect_timeout_s: float
    sentinel_password: str = ""

    @classmethod
    def of(cls, settings: RedisSettings) -> Endpoint:
        return cls(
            settings.redis_url,
            settings.redis_socket_timeout_s,
            settings.redis_connect_timeout_s,
            settings.redis_sentinel_password,
        )

    @property
    def target(self) -> RedisTarget:
        return parse(self.url, sentinel_password=self.sentinel_password)

    def timeouts(self) -> dict[str, float]:
        return {"socket_timeout": self.socket_timeout_s, "socket_connect_timeout": self.connect_timeout_s}


def _sync_client_at(endpoint: Endpoint, **extra: Any) -> redis.Redis:
    options: dict[str, Any] = {
        **endpoint.timeouts(),
        "health_check_interval": _HEALTH_CHECK_S,
        "retry": sync_retry(endpoint.socket_timeout_s),
        **extra,
    }
    target = endpoint.target
    if not target.is_sentinel:
        return redis.Redis(connection_pool=redis.ConnectionPool.from_url(endpoint.url, **options))
    sentinel = Sentinel(
        target.sentinels,
        sentinel_kwargs=target.sentinel_kwargs(**endpoint.timeouts()),
        **target.node_kwargs(),
    )
    client: redis.Redis = sentinel.master_for(target.master, **options)
    return client


@lru_cache(maxsize=8)
def _sync_pool(endpoint: Endpoint) -> redis.ConnectionPool:
    return _sync_client_at(endpoint).connection_pool


def sync_client(settings: RedisSettings) -> redis.Redis:
    """A client on this process's pool for ``settings``' Redis (shared by every thread)."""
    return redis.Redis(connection_pool=_sync_pool(Endpoint.of(settings)))


def probe_client(endpoint: Endpoint) -> redis.Redis:
    """A client on a pool of its own that does not retry (a one-off check: close it after)."""
    return _sync_client_at(endpoint, retry=Retry(NoBackoff(), 0))


def async_client_at(endpoint: Endpoint, **extra: Any) -> aioredis.Redis:
    """A new asyncio client (``extra``: more of redis-py's keyword arguments); the caller owns it."""
    options: dict[str, Any] = {
        **endpoint.timeouts(),
        "health_check_interval": _HEALTH_CHECK_S,
        "decode_responses": False,
        "retry": async_retry(endpoint.socket_timeout_s),
        **extra,
    }
    target = endpoint.target
    if not target.is_sentinel:
        return aioredis.Redis.from_url(endpoint.url, **options)
    sentinel = AsyncSentinel(
        target.sentinels,
        sentinel_kwargs=target.sentinel_kwargs(**endpoint.timeouts()),
        **target.node_kwargs(),
    )
    client: aioredis.Redis = sentinel.master_for(target.master, **options)
    return client


def async_client(settings: RedisSettings) -> aioredis.Redis:
    """A new asyncio client; the caller owns it (one per event loop)."""
    return async_client_at(Endpoint.of(settings), max_connections=512)
