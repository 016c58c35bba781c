"""Level-1 cache: normalised query → final response, checked by the API before any queue.

Keys carry index name and version (``<prefix>:qc:<index>:<version>:<digest>``), so a re-ingest
never serves a stale answer. The bound is an entry budget with LRU eviction kept by the scripts
beside this module, because Redis' own ``maxmemory-policy`` would apply to the queues too.
Single flight: the first request for a key claims it; identical concurrent requests follow the
leader's event stream instead of computing again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import IntEnum
from importlib import resources

import redis.asyncio as aioredis

from broker.keys import Keys


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


def _script(name: str) -> str:
    return resources.files("broker").joinpath(name).read_text()


_LOOKUP = _script("result_cache_lookup.lua")
_STORE = _script("result_cache_store.lua")
# Compare-and-delete, so a leader never frees a claim a newer leader holds.
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class ResultCache:
    def __init__(
        self, client: aioredis.Redis, keys: Keys, *, ttl_s: int, max_entries: int, single_flight_ttl_s: float
    ) -> None:
        self._keys = keys
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._sf_ttl_ms = int(single_flight_ttl_s * 1000)
        self._lookup = client.register_script(_LOOKUP)
        self._store = client.register_script(_STORE)
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

    async def store(self, key: str, body: bytes, *, leader: str = "") -> None:
        await self._store(
            args=[
                key,
                body,
                self._ttl_s,
                int(time.time() * 1000),
                self._max_entries,
                f"{self._keys.result_cache}:lru",
                leader,
            ]
        )

    async def release(self, key: str, leader: str) -> None:
        """Give up a single-flight claim (the leader failed): the next request computes afresh."""
        await self._release(keys=[f"{key}:sf"], args=[leader])
