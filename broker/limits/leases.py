"""Per-key caps on what one API key holds at once: leases in Redis.

A lease is a member of a sorted set per key and kind (``requests``, ``streams``), scored by its
expiry. ``lease_acquire.lua`` drops the expired ones, refuses past the cap and adds the new one,
in one step, so the cap holds across any number of API processes. A request releases its lease
when it ends; one that a dead process leaves behind expires on its own, after its time to live
(longer than any request may last). Past the cap the caller gets :class:`CapReached`, which the
API answers with 429 ``key_cap`` (``api/errors.py``).

The third cap, on a key's unfinished jobs, is not a lease: a job outlives the request that made
it, so it is counted where its record is created (``job_create.lua``, :mod:`ragline.broker.state.jobs`).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis
from ragline.broker.errors import RaglineError
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.scripts import AsyncStateScript, lua

_SCRIPT = lua(__package__, "lease_acquire")

REQUESTS = "requests"
STREAMS = "streams"
UNFINISHED_JOBS = "unfinished jobs"


class CapReached(RaglineError):
    """The key already holds ``cap`` of ``kind`` (requests, streams, unfinished jobs)."""

    def __init__(self, kind: str, cap: int) -> None:
        super().__init__(
            f"this API key already has {cap} {kind} open, its cap (key_max_{kind.replace(' ', '_')}); "
            "retry when one of them ends"
        )
        self.kind = kind
        self.cap = cap


@dataclass(frozen=True, slots=True)
class Lease:
    key: str  # the sorted set it is a member of
    lease_id: str


class Leases:
    """Takes and releases leases; every call bounded by ``timeout_s``."""

    def __init__(self, client: aioredis.Redis, keys: Keys, *, ttl_s: float, timeout_s: float) -> None:
        self._client = client
        self._keys = keys
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._timeout_s = timeout_s
        # Taken on a Redis at its memory limit too (a small, bounded write): resumes keep working.
        self._acquire = AsyncStateScript(client, _SCRIPT)

    async def acquire(self, kind: str, principal: str, cap: int) -> Lease:
        """One of ``principal``'s leases of ``kind``; :class:`CapReached` when it holds ``cap``."""
        lease = Lease(self._keys.leases(kind, principal), uuid.uuid4().hex)
        async with asyncio.timeout(self._timeout_s):
            taken = await self._acquire(keys=[lease.key], args=[lease.lease_id, cap, self._ttl_ms])
        if not int(taken):
            raise CapReached(kind, cap)
        return lease

    async def release(self, lease: Lease) -> None:
        async with asyncio.timeout(self._timeout_s):
            await self._client.zrem(lease.key, lease.lease_id)
