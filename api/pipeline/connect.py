"""The pipeline's parts on a real Redis: the result cache, the task publisher, the event reader,
the index registry, cancel flags, and the count of live retrieval workers (the coalescer keeps
one batch in flight per worker)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import redis.asyncio as aioredis
from celery import Celery
from ragline.api.pipeline import Pipeline
from ragline.api.pipeline.admission import Admission
from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import RetrieveRequest, RetrieveTask
from ragline.broker.contract.queues import RETRIEVAL_QUEUE, RETRIEVE_TASK
from ragline.broker.limits.leases import Leases
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.replies import text
from ragline.broker.redis.task_push import QueuePusher, task_message
from ragline.broker.state import indexes, liveness
from ragline.broker.state.result_cache import ResultCache
from ragline.broker.state.semantic_cache import SemanticCommits
from ragline.broker.streams.cancel import arequest_cancel
from ragline.broker.streams.events import Event, read_events
from ragline.broker.tracing import propagation

_ENQUEUE_TIMEOUT_S = 5.0
_LEASE_TIMEOUT_S = 2.0
# A lease outlives the longest a request may hold it (its wait for events is cut off at the
# request timeout; before it, the coalescer's hold and the enqueue take seconds at most), so only
# a lease whose API process died expires while still listed.
_LEASE_MARGIN_S = 30.0


class RetrievalWorkers:
    """Live retrieval workers (each takes one batch at a time), recounted about every second in
    the background; the last count stands while Redis is slow."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, heartbeat_ttl_s: float) -> None:
        self._redis = redis
        self._keys = keys
        self._ttl_s = heartbeat_ttl_s
        self._seen = (1, 0.0)  # (count, when counted)
        self._recount: asyncio.Task[None] | None = None

    def __call__(self) -> int:
        count, counted_at = self._seen
        if time.monotonic() - counted_at > 1.0 and (self._recount is None or self._recount.done()):
            self._seen = (count, time.monotonic())
            self._recount = asyncio.get_running_loop().create_task(self._count())
        return count

    async def _count(self) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                counts = await liveness.live_counts(self._redis, self._keys, (RETRIEVAL_QUEUE,), self._ttl_s)
            self._seen = (max(1, counts[RETRIEVAL_QUEUE]), time.monotonic())


class StreamOwners:
    """Each resumable stream's owner, in Redis for as long as the stream itself lives."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, *, ttl_s: int) -> None:
        self._redis = redis
        self._keys = keys
        self._ttl_s = ttl_s

    async def record(self, request_id: str, owner: str) -> None:
        key = self._keys.stream_owner(request_id)
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(key, owner, ex=self._ttl_s)
        pipe.ttl(self._keys.events(request_id))
        _, stream_ttl = await pipe.execute()
        # A request that finished before its owner was recorded (a fast answer) has a stream
        # with its shorter finished TTL: the owner must not outlive it (a resume then waits on
        # nothing instead of a 404). Once finished later, the worker expires the owner itself.
        if 0 < stream_ttl < self._ttl_s:
            await self._redis.expire(key, stream_ttl)

    async def owner_of(self, request_id: str) -> str | None:
        owner = await self._redis.get(self._keys.stream_owner(request_id))
        return text(owner) if owner is not None else None


def _semantic_commits(settings: Settings, redis: aioredis.Redis, keys: Keys) -> SemanticCommits | None:
    """The semantic cache's writes, when it is on (its entries live as long as the answers)."""
    retrieval = settings.retrieval
    if not retrieval.semantic_cache:
        return None
    return SemanticCommits(
        redis,
        keys,
        ttl_s=settings.api.result_cache_ttl_s,
        scope_max_entries=retrieval.semantic_cache_scope_max_entries,
        max_entries=retrieval.semantic_cache_max_entries,
        max_memory_fraction=retrieval.cache_write_max_memory_fraction,
    )


class PipelineResources:
    """The pipeline on real Redis and Celery, and what it holds open (the task pusher's
    connections): built when the API starts, closed when it stops."""

    def __init__(
        self, settings: Settings, redis: aioredis.Redis, celery: Celery, admission: Admission
    ) -> None:
        keys = Keys(settings.redis.key_prefix)
        api = settings.api
        self._celery = celery
        self._pusher = QueuePusher(
            settings.redis.redis_url,
            timeout_s=_ENQUEUE_TIMEOUT_S,
            sentinel_password=settings.redis.redis_sentinel_password,
        )

        def publish(items: list[RetrieveRequest]) -> asyncio.Future[None]:
            message = task_message(
                celery,
                RETRIEVE_TASK,
                RetrieveTask(requests=items).encode(),
                queue=RETRIEVAL_QUEUE,
                kwargsrepr=f"{{'requests': <{len(items)} queries>}}",
                headers=propagation.batch_headers(item.request_id for item in items),
            )
            return self._pusher.push(RETRIEVAL_QUEUE, message)

        def events(request_id: str, after: str) -> AsyncIterator[Event]:
            return read_events(redis, keys, request_id, after=after, timeout_s=api.request_timeout_s)

        async def index_version(index: str) -> str | None:
            info = await indexes.alookup(redis, keys, index)
            return info.version if info is not None else None

        async def cancel(request_id: str) -> None:
            await arequest_cancel(redis, keys, request_id, ttl_s=settings.jobs.cancel_ttl_s)

        self.pipeline = Pipeline(
            api,
            settings.retrieval,
            settings.generation,
            admission,
            keys=keys,
            cache=ResultCache(
                redis,
                keys,
                ttl_s=api.result_cache_ttl_s,
                max_entries=api.result_cache_max_entries,
                max_bytes=api.result_cache_max_bytes,
                single_flight_ttl_s=api.single_flight_ttl_s,
                max_memory_fraction=settings.retrieval.cache_write_max_memory_fraction,
            ),
            publish=publish,
            read_events=events,
            index_version=index_version,
            cancel=cancel,
            owners=StreamOwners(redis, keys, ttl_s=settings.redis.event_stream_ttl_s),
            leases=Leases(
                redis, keys, ttl_s=api.request_timeout_s + _LEASE_MARGIN_S, timeout_s=_LEASE_TIMEOUT_S
            ),
            retrieval_workers=RetrievalWorkers(redis, keys, settings.redis.worker_heartbeat_ttl_s),
            semantic=_semantic_commits(settings, redis, keys),
        )

    async def send(self, queue: str, task: str, kwargs: dict[str, object], *, kwargsrepr: str) -> None:
        """Enqueue one task of another kind than a query's (an ingest, say), bounded like theirs."""
        await self._pusher.push(
            queue, task_message(self._celery, task, kwargs, queue=queue, kwargsrepr=kwargsrepr)
        )

    async def aclose(self) -> None:
        await self.pipeline.aclose()
        await self._pusher.aclose()
