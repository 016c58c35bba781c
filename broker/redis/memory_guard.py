"""Caches give way first when Redis nears its memory limit.

ragline's Redis runs ``maxmemory`` with ``noeviction`` (an evicted queue or unacked hash is a lost
task), so a full Redis refuses every write: the door's token bucket, new jobs, the queues. A cache
write is the one write that can be skipped at no cost but a later recomputation, so a cache
checks, at most every ``refresh_s``, how much of ``maxmemory`` Redis uses, and writes only below
``max_fraction`` of it: the rest stays for the state that must be written. A write Redis refuses
anyway (OOM) is dropped the same way. Both are counted in ``ragline_cache_writes_dropped_total``.
The result cache also sheds entries then (``broker/state/result_cache_shed.lua``), and finished streams
are cut to their linger time (``ragline.broker.streams.events.FinishedStreamTtl``).
"""

from __future__ import annotations

import time
from typing import Any

import redis
import redis.asyncio as aioredis
from ragline.broker import metrics


def _has_room(info: dict[str, Any], max_fraction: float) -> bool:
    limit = int(info.get("maxmemory") or 0)
    if limit <= 0 or max_fraction >= 1.0:  # no limit to protect, or the guard is off
        return True
    return int(info.get("used_memory") or 0) < max_fraction * limit


class _Decision:
    def __init__(self, level: str, max_fraction: float, refresh_s: float) -> None:
        self.level = level
        self._max_fraction = max_fraction
        self._refresh_s = refresh_s
        self._read_at = -refresh_s
        self._room = True

    def due(self) -> bool:
        return time.monotonic() - self._read_at >= self._refresh_s

    def learn(self, info: dict[str, Any] | None) -> bool:
        self._read_at = time.monotonic()
        if info is not None:  # an INFO that failed keeps the last answer
            self._room = _has_room(info, self._max_fraction)
        return self._room

    def dropped(self, reason: str, count: int = 1) -> None:
        metrics.CACHE_WRITES_DROPPED.labels(self.level, reason).inc(count)
        if reason == "oom":  # full until the next reading says otherwise
            self._room = False
            self._read_at = time.monotonic()

    @property
    def room(self) -> bool:
        return self._room


class MemoryGuard(_Decision):
    """For a sync client (workers, ingestion)."""

    def __init__(
        self, client: redis.Redis, level: str, *, max_fraction: float, refresh_s: float = 1.0
    ) -> None:
        super().__init__(level, max_fraction, refresh_s)
        self._client = client

    def allows_write(self) -> bool:
        if not self.due():
            return self.room
        try:
            info = self._client.info("memory")
        except redis.RedisError:
            info = None
        return self.learn(info)


class AsyncMemoryGuard(_Decision):
    """For an asyncio client (the API's result cache)."""

    def __init__(
        self, client: aioredis.Redis, level: str, *, max_fraction: float, refresh_s: float = 1.0
    ) -> None:
        super().__init__(level, max_fraction, refresh_s)
        self._client = client

    async def allows_write(self) -> bool:
        if not self.due():
            return self.room
        try:
            info = await self._client.info("memory")
        except redis.RedisError:
            info = None
        return self.learn(info)
