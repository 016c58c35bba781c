"""Level-1 cache: normalised query → final response, checked by the API before any queue.

Keys carry index name and version (``<prefix>:qc:<index>:<version>:<digest>``), so a re-ingest
never serves a stale answer. The bounds are an entry budget and a byte budget (an answer at
``top_k=50`` is ~50-65 KB), with LRU eviction kept by the scripts beside this module, because
Redis' own ``maxmemory-policy`` would apply to the queues too. Near Redis' memory limit writes
are dropped (``broker/redis/memory_guard.py``): a skipped write costs a recomputation, never an answer.
Single flight: the first request for a key claims it; identical concurrent requests follow the
leader's event stream instead of computing again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import IntEnum

import redis
import redis.asyncio as aioredis
from ragline.broker import metrics
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.memory_guard import AsyncMemoryGuard
from ragline.broker.redis.scripts import AsyncStateScript, lua


class Outcome(IntEnum):
    UNKNOWN_INDEX = 0
    HIT = 1
    MISS = 2
    LEAD = 3
    FOLLOW = 4


@dataclass(frozen=True, slots=True)
class Lookup:
    outcome: Outcome
    version: str = ""
    body: bytes = b""
    leader: str = ""

    def key(self, keys: Keys, index: str, digest: str) -> str:
        return f"{keys.result_cache}:{index}:{self.version}:{digest}"


_LOOKUP = lua(__package__, "result_cache_lookup")
_STORE = lua(__package__, "result_cache_store")
_SHED = lua(__package__, "result_cache_shed")
# Entries evicted per write dropped near the memory limit: more than the write would have added,
# so the cache shrinks for as long as the pressure lasts, and grows again once it is gone.
SHED_PER_DROPPED_WRITE = 2
# Compare-and-delete, so a leader never frees a claim a newer leader holds.
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class ResultCache:
    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        *,
        ttl_s: int,
        max_entries: int,
        max_bytes: int,
        single_flight_ttl_s: float,
        max_memory_fraction: float = 1.0,
    ) -> None:
        self._keys = keys
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._guard = AsyncMemoryGuard(client, "result", max_fraction=max_memory_fraction)
        self._sf_ttl_ms = int(single_flight_ttl_s * 1000)
        self._lookup = AsyncStateScript(client, _LOOKUP)
        self._store = client.register_script(_STORE)
        self._shed = AsyncStateScript(client, _SHED)
        self._release = client.register_script(_RELEASE)

    async def lookup(self, index: str, digest: str, *, request_id: str = "") -> Lookup:
        now_ms = int(time.time() * 1000)
        reply = await self._lookup(
            keys=[self._keys.indexes],
            args=[index, self._keys.result_cache, digest, request_id, self._sf_ttl_ms, now_ms],
        )
        outcome = Outcome(int(reply[0]))
        version = reply[1].decode() if len(reply) > 1 else ""
        if outcome is Outcome.HIT:
            return Lookup(outcome, version, body=reply[2])
        if outcome is Outcome.FOLLOW:
            return Lookup(outcome, version, leader=reply[2].decode())
        return Lookup(outcome, version)

    async def store(self, key: str, body: bytes, *, leader: str = "") -> bool:
        """Cache ``body`` under ``key`` (and give up the caller's single-flight claim); False when
        the write was dropped: Redis near its memory limit, or the answer over the byte budget."""
        prefix = self._keys.result_cache
        if not await self._guard.allows_write():
            self._guard.dropped("memory")
            await self._release_claim(key, leader)
            await self._give_way(prefix)
            return False
        try:
            stored = await self._store(
                args=[
                    key,
                    body,
                    self._ttl_s,
                    int(time.time() * 1000),
                    self._max_entries,
                    f"{prefix}:lru",
                    leader,
                    self._max_bytes,
                    f"{prefix}:sizes",
                    f"{prefix}:bytes",
                ]
            )
        except redis.exceptions.OutOfMemoryError:
            self._guard.dropped("oom")
            await self._release_claim(key, leader)
            await self._give_way(prefix)
            return False
        return bool(int(stored))

    async def _give_way(self, prefix: str) -> None:
        """Near the memory limit the cache does not only stop growing: it shrinks, and the
        memory goes to the state that must be written (streams, queues, job records)."""
        try:
            evicted = await self._shed(
                args=[f"{prefix}:lru", f"{prefix}:sizes", f"{prefix}:bytes", SHED_PER_DROPPED_WRITE]
            )
        except redis.RedisError:  # the next dropped write tries again
            return
        if evicted:
            metrics.CACHE_ENTRIES_SHED.labels("result").inc(int(evicted))

    async def _release_claim(self, key: str, leader: str) -> None:
        if leader:
            await self.release(key, leader)

    async def release(self, key: str, leader: str) -> None:
        """Give up a single-flight claim (the leader failed): the next request computes afresh."""
        await self._release(keys=[f"{key}:sf"], args=[leader])
