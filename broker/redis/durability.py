"""Accepted means replicated: a write that makes a job durable waits until replicas have it.

Redis replicates asynchronously: a write the primary acknowledged is lost if the primary dies
before a replica has it, and Sentinel then promotes a replica without it. ``WAIT n ms`` blocks
until ``n`` replicas have acknowledged every write *this connection* made, or the time is up,
and says how many did. The writes to confirm come from several connections (a script on one, a
task pushed on another), so :class:`Replication` writes once more on a connection of its own, a
refresh of the record's TTL, and waits on that same connection: the replication stream is one
ordered log, so a replica that has this last write has every write made before it, whichever
connection made it.

Used where losing a write breaks a promise: a job's creation (its ``202``, in the API), its
final state (the worker), a webhook attempt's claim before the POST and its outcome after (the
callbacks worker). Caches, token buckets and streams in flight are not waited for: losing them
costs a recomputation, a burst let through or a resumed stream (docs/operations.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
import redis.asyncio as aioredis
from ragline.broker.config.settings import RedisSettings
from ragline.broker.errors import RaglineError


class NotReplicated(RaglineError):
    """Fewer replicas than required acknowledged a write in time: it may be lost in a failover."""

    def __init__(self, acked: int, wanted: int, timeout_ms: int) -> None:
        super().__init__(f"{acked} of {wanted} Redis replicas acknowledged the write within {timeout_ms} ms")
        self.acked = acked
        self.wanted = wanted


# Errors that leave a write's replication unknown: too few acknowledged, or the primary went away
# while it was asked.
UNCONFIRMED = (NotReplicated, redis.ConnectionError, redis.TimeoutError)


@dataclass(frozen=True, slots=True)
class Replication:
    """How many replicas a durable write waits for (0: none, nothing is sent) and how long."""

    replicas: int
    timeout_ms: int

    @classmethod
    def of(cls, settings: RedisSettings) -> Replication:
        return cls(settings.wait_replicas, settings.redis_wait_ms)

    def _check(self, acked: object) -> None:
        count = int(acked)  # type: ignore[call-overload]  # WAIT's reply: an integer
        if count < self.replicas:
            raise NotReplicated(count, self.replicas, self.timeout_ms)

    def confirm(self, client: redis.Redis, key: str, ttl_s: int) -> None:
        """Every write made before this call is on ``replicas`` replicas; ``key`` (a record just
        written) keeps ``ttl_s``. :class:`NotReplicated` when too few acknowledged in time."""
        if self.replicas <= 0:
            return
        pipe = client.pipeline(transaction=False)  # one connection: WAIT counts its own writes
        pipe.expire(key, ttl_s)
        pipe.wait(self.replicas, self.timeout_ms)
        _, acked = pipe.execute()
        self._check(acked)

    async def aconfirm(self, client: aioredis.Redis, key: str, ttl_s: int) -> None:
        """As :meth:`confirm`, for an asyncio client."""
        if self.replicas <= 0:
            return
        pipe = client.pipeline(transaction=False)
        pipe.expire(key, ttl_s)
        pipe.wait(self.replicas, self.timeout_ms)
        _, acked = await pipe.execute()
        self._check(acked)


NO_WAIT = Replication(0, 0)
