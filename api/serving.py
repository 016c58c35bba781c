"""Query serving: validate, answer from the result cache, admit (or degrade, or refuse), coalesce
into retrieval batches and relay the request's events; identical concurrent queries are computed once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, replace
from typing import Any, Literal

import redis.asyncio as aioredis
from celery import Celery

from api.admission import Action, Admission, Decision
from api.coalescer import Coalescer
from api.errors import ApiError
from api.protocol import QueryRequest, QueryResponse
from broker import indexes, liveness, metrics
from broker.cancel import arequest_cancel
from broker.contract import Degradation, Done, Error, RetrieveRequest, RetrieveTask, Source, Sources
from broker.events import Event, EventTimeout, read_events
from broker.keys import Keys
from broker.normalize import query_digest
from broker.queues import RETRIEVAL_QUEUE, RETRIEVE_TASK
from broker.result_cache import Lookup, Outcome, ResultCache
from broker.settings import Settings
from broker.task_push import QueuePusher, task_message

_INDEX_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_ENQUEUE_TIMEOUT_S = 5.0
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Admitted:
    query: str
    top_k: int
    mode: Literal["rag", "retrieval"]
    index: str
    ef_search: int | None
    nprobe: int | None
    allow_early_exit: bool


def _bounded(name: str, value: int | None, upper: int) -> int | None:
    if value is not None and not 1 <= value <= upper:
        raise ApiError(422, "invalid_request", f"{name} must be between 1 and {upper}, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class Probe:
    """What the fast path learnt of a request it could not answer from the cache: it goes on
    from here instead of validating, deciding and looking it up again."""

    admitted: Admitted
    decision: Decision
    found: Lookup
    key: str


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """What a stream request got: a cached answer's JSON, or an enqueued request; maybe degraded."""

    cached: bytes | None = None
    degraded: Decision | None = None
    predicted_wait_s: float | None = None  # admission's, for the enqueued request


def degradation(decision: Decision | None) -> Degradation | None:
    """What a degraded answer says of it (in the JSON response and the stream's ``done``)."""
    if decision is None or not decision.degraded:
        return None
    return Degradation(degraded_reason=decision.reason, notice=decision.message)


def degraded_fields(decision: Decision | None) -> dict[str, Any]:
    """:func:`degradation` as fields to update an answer with (none when not degraded)."""
    found = degradation(decision)
    return dict(found) if found is not None else {}


def _overloaded(decision: Decision) -> ApiError:
    return ApiError(503, "overloaded", decision.message, headers={"Retry-After": str(decision.retry_after_s)})


class QueryService:
    def __init__(
        self,
        settings: Settings,
        redis: aioredis.Redis,
        celery: Celery,
        admission: Admission | None = None,
    ) -> None:
        self._settings = settings
        self._admission = admission or Admission(settings, None)
        self._redis = redis
        self._celery = celery
        self._keys = Keys(settings.key_prefix)
        self._cache = ResultCache(
            redis,
            self._keys,
            ttl_s=settings.result_cache_ttl_s,
            max_entries=settings.result_cache_max_entries,
            single_flight_ttl_s=settings.single_flight_ttl_s,
        )
        self._background: set[asyncio.Task[object]] = set()
        self._pusher = QueuePusher(settings.redis_url, timeout_s=_ENQUEUE_TIMEOUT_S)
        self._coalescer: Coalescer[RetrieveRequest] = Coalescer(
            self._publish_batch,
            window_s=settings.coalesce_window_ms / 1000,
            max_batch=settings.coalesce_max_batch,
            max_in_flight=self._retrieval_workers,
        )
        self._workers_seen = (1, 0.0)  # (live retrieval workers, when counted)

    def _retrieval_workers(self) -> int:
        """Live retrieval workers (each takes one batch at a time), recounted about every second."""
        count, counted_at = self._workers_seen
        if time.monotonic() - counted_at > 1.0:
            self._workers_seen = (count, time.monotonic())
            self._spawn(self._count_workers())
        return count

    async def _count_workers(self) -> None:
        s = self._settings
        with contextlib.suppress(Exception):  # keep the last count if Redis is slow
            async with asyncio.timeout(1.0):
                counts = await liveness.live_counts(
                    self._redis, self._keys, (RETRIEVAL_QUEUE,), s.worker_heartbeat_ttl_s
                )
            self._workers_seen = (max(1, counts[RETRIEVAL_QUEUE]), time.monotonic())

    def _spawn(self, work: Coroutine[Any, Any, object]) -> None:
        """Run ``work`` in the background, holding a reference until it is done."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _soon(self, work: Coroutine[Any, Any, object]) -> None:
        """Run ``work`` in the background, bounded by the Redis timeout; a failure is logged."""

        async def bounded() -> None:
            try:
                async with asyncio.timeout(_ENQUEUE_TIMEOUT_S):
                    await work
            except Exception:
                log.warning("background cache write failed", exc_info=True)

        self._spawn(bounded())

    async def aclose(self) -> None:
        await self._pusher.aclose()

    def cancel_soon(self, request_id: str) -> None:
        """Flag ``request_id`` cancelled without awaiting (callable from a closing generator)."""
        self._spawn(arequest_cancel(self._redis, self._keys, request_id, ttl_s=self._settings.cancel_ttl_s))

    def admit(self, req: QueryRequest) -> Admitted:
        """Check the request beyond its types (no I/O)."""
        s = self._settings
        query = req.query.strip()
        if not query:
            raise ApiError(422, "invalid_request", "query must not be empty")
        size = len(query.encode())
        if size > s.max_query_bytes:
            raise ApiError(422, "invalid_request", f"query is {size} bytes; the limit is {s.max_query_bytes}")
        top_k = s.default_top_k if req.top_k is None else req.top_k
        if not 1 <= top_k <= s.max_top_k:
            raise ApiError(422, "invalid_request", f"top_k must be between 1 and {s.max_top_k}, got {top_k}")
        index = req.index or s.default_index
        if not _INDEX_NAME.match(index):
            raise ApiError(422, "invalid_request", "index must match [A-Za-z0-9_.-]{1,64}")
        return Admitted(
            query=query,
            top_k=top_k,
            mode=req.mode,
            index=index,
            ef_search=_bounded("ef_search", req.ef_search, s.max_ef_search),
            nprobe=_bounded("nprobe", req.nprobe, s.max_nprobe),
            allow_early_exit=req.allow_early_exit,
        )

    def _digest(self, a: Admitted) -> str:
        return query_digest(
            a.query,
            a.top_k,
            a.mode,
            a.ef_search,
            a.nprobe,
            a.allow_early_exit,
            self._settings.generation_model,
        )

    async def lookup(self, a: Admitted, request_id: str, *, single_flight: bool) -> tuple[Lookup, str]:
        digest = self._digest(a)
        found = await self._cache.lookup(a.index, digest, request_id=request_id if single_flight else "")
        if found.outcome is Outcome.UNKNOWN_INDEX:
            raise ApiError(404, "unknown_index", f"index {a.index!r} does not exist; ingest it first")
        if found.outcome is Outcome.HIT:
            metrics.CACHE_HITS.labels("result").inc()
        else:
            metrics.CACHE_MISSES.labels("result").inc()
        return found, found.key(self._keys, a.index, digest)

    async def cached_answer(
        self, raw: bytes, request_id: str, *, deadline_ms: int | None = None
    ) -> bytes | Probe | None:
        """The cached response for this JSON body; else what it takes to answer it (the admission
        decision and the lookup, which claimed the computation when admitted); None when the body
        is not a plain valid request (the route answers it in full)."""
        try:
            req = QueryRequest.model_validate_json(raw)
            a = self.admit(req)
            decision = self._decide(a, req, self._admission.deadline_s(deadline_ms))
            found, key = await self.lookup(a, request_id, single_flight=decision.action is Action.ADMIT)
        except Exception:  # invalid body, unknown index, Redis trouble: the route reports it
            return None
        if found.outcome is Outcome.HIT:
            return splice(request_id, found.body)
        return Probe(a, decision, found, key)

    def _publish_batch(self, items: list[RetrieveRequest]) -> asyncio.Future[None]:
        message = task_message(
            self._celery,
            RETRIEVE_TASK,
            RetrieveTask(requests=items).encode(),
            queue=RETRIEVAL_QUEUE,
            kwargsrepr=f"{{'requests': <{len(items)} queries>}}",
        )
        return self._pusher.push(RETRIEVAL_QUEUE, message)

    async def index_version(self, index: str) -> str:
        """The current version of ``index``, or 404 (for callers that skip the result cache)."""
        info = await indexes.alookup(self._redis, self._keys, index)
        if info is None:
            raise ApiError(404, "unknown_index", f"index {index!r} does not exist; ingest it first")
        return info.version

    async def enqueue(
        self,
        request_id: str,
        a: Admitted,
        *,
        index_version: str,
        job_id: str | None = None,
        degraded: Decision | None = None,
    ) -> None:
        item = RetrieveRequest(
            request_id=request_id,
            query=a.query,
            top_k=a.top_k,
            mode=a.mode,
            index=a.index,
            index_version=index_version,
            ef_search=a.ef_search,
            nprobe=a.nprobe,
            allow_early_exit=a.allow_early_exit,
            enqueued_at=time.time(),
            job_id=job_id,  # an async job: the tasks mirror their events into its record
            # The worker copies these into the stream's `done`, so an SSE resume sees them too.
            degraded=degradation(degraded),
        )
        try:
            await self._coalescer.submit(item)
            if job_id is not None:
                self._coalescer.settle(request_id)  # nobody here waits for a job's events
        except Exception as exc:
            raise ApiError(
                503, "unavailable", f"could not enqueue the request: {exc!r}", headers={"Retry-After": "1"}
            ) from exc
        self._admission.admitted(a.mode, request_id)
        if job_id is not None:
            self._admission.retrieved(request_id)  # its retrieval is not watched here

    async def events(
        self, request_id: str, *, after: str = "0-0", settle: bool = False
    ) -> AsyncIterator[Event]:
        """The request's events; with ``settle`` the coalescer learns when retrieval answered."""
        pending = settle
        try:
            async for event in read_events(
                self._redis, self._keys, request_id, after=after, timeout_s=self._settings.request_timeout_s
            ):
                if pending:
                    pending = False
                    self._coalescer.settle(request_id)
                    self._admission.retrieved(request_id)
                yield event
        finally:
            if pending:
                self._coalescer.settle(request_id)
                self._admission.retrieved(request_id)

    def _decide(self, a: Admitted, req: QueryRequest, deadline_s: float | None) -> Decision:
        deadline = self._admission.deadline_s(None) if deadline_s is None else deadline_s
        return self._admission.decide(a.mode, allow_degraded=req.allow_degraded, deadline_s=deadline)

    async def answer(
        self, request_id: str, req: QueryRequest, *, deadline_s: float | None = None
    ) -> QueryResponse | bytes:
        """A full response, or the cached response's JSON bytes (spliced with this request's id).

        The admission decision is taken first only because it is free (this process's snapshot);
        it is applied after the cache: a hit is served whatever the load, since it touches no queue.
        """
        a = self.admit(req)
        return await self._answer(request_id, a, self._decide(a, req, deadline_s), probe=None)

    async def answer_probed(self, request_id: str, probe: Probe) -> QueryResponse | bytes:
        """The answer to a request the fast path validated, decided and looked up (a miss)."""
        return await self._answer(request_id, probe.admitted, probe.decision, probe=probe)

    async def _answer(
        self, request_id: str, a: Admitted, decision: Decision, *, probe: Probe | None
    ) -> QueryResponse | bytes:
        started = time.perf_counter()
        if decision.action is Action.ADMIT:
            return await self._serve(request_id, a, started, probe=probe, predicted_wait_s=decision.wait_s)
        # Overloaded: look the answer up without claiming its computation (single flight).
        if probe is not None:
            found = probe.found
        else:
            found, _key = await self.lookup(a, request_id, single_flight=False)
        if found.outcome is Outcome.HIT:
            return splice(request_id, found.body)
        if decision.action is Action.REJECT:
            raise _overloaded(decision)
        return await self._serve(
            request_id,
            replace(a, mode="retrieval"),
            started,
            degraded=decision,
            predicted_wait_s=decision.wait_s,
        )

    async def _serve(
        self,
        request_id: str,
        a: Admitted,
        started: float,
        *,
        degraded: Decision | None = None,
        probe: Probe | None = None,
        predicted_wait_s: float | None = None,
    ) -> QueryResponse | bytes:
        if probe is not None:
            found, key = probe.found, probe.key
        else:
            found, key = await self.lookup(a, request_id, single_flight=True)
        if found.outcome is Outcome.HIT:
            if degraded is None:
                return splice(request_id, found.body)
            hit = QueryResponse.model_validate_json(splice(request_id, found.body))
            return hit.model_copy(update=degraded_fields(degraded))
        source_id = found.leader if found.outcome is Outcome.FOLLOW else request_id
        leading = found.outcome is Outcome.LEAD
        try:
            if found.outcome is not Outcome.FOLLOW:
                await self.enqueue(request_id, a, index_version=found.version, degraded=degraded)
            response, version = await self._collect(
                request_id,
                source_id,
                started,
                settle=source_id == request_id,
                predicted_wait_s=predicted_wait_s,
            )
        except BaseException:
            if leading:
                await self._cache.release(key, request_id)
            raise
        # Cache only what was computed on the version the key names (a re-ingest may have raced).
        # Off the answer's path: followers read the leader's stream, not the cache.
        if version != found.version:
            if leading:
                self._soon(self._cache.release(key, request_id))
        elif leading or found.outcome is Outcome.MISS:
            # Stored as a plain answer of its mode: a degraded request was a retrieval request.
            cached = response.model_copy(update={"cached": True})
            self._soon(
                self._cache.store(
                    key,
                    cached.model_dump_json(exclude={"request_id"}).encode(),
                    leader=request_id if leading else "",
                )
            )
        if degraded is not None:
            return response.model_copy(update=degraded_fields(degraded))
        return response

    async def plan_stream(
        self, request_id: str, req: QueryRequest, *, deadline_s: float | None = None
    ) -> StreamPlan:
        """Admit a stream request: a cached answer to replay, or enqueue it (raises 503 when refused).

        Streams skip single flight: a client resumes by its own request id, so it needs its own stream.
        """
        a = self.admit(req)
        decision = self._decide(a, req, deadline_s)
        found, _key = await self.lookup(a, request_id, single_flight=False)
        if found.outcome is Outcome.HIT:
            return StreamPlan(cached=found.body)
        if decision.action is Action.REJECT:
            raise _overloaded(decision)
        degraded = None
        if decision.action is Action.DEGRADE:
            degraded = decision
            a = replace(a, mode="retrieval")
            found, _key = await self.lookup(a, request_id, single_flight=False)
            if found.outcome is Outcome.HIT:
                return StreamPlan(cached=found.body, degraded=degraded)
        await self.enqueue(request_id, a, index_version=found.version, degraded=degraded)
        return StreamPlan(degraded=degraded, predicted_wait_s=decision.wait_s)

    async def _collect(
        self,
        request_id: str,
        source_id: str,
        started: float,
        *,
        settle: bool,
        predicted_wait_s: float | None = None,
    ) -> tuple[QueryResponse, str | None]:
        """The response built from ``source_id``'s events, and the index version it was computed on."""
        sources: list[Source] = []
        version: str | None = None
        try:
            async for event in self.events(source_id, settle=settle):
                payload = event.payload
                if isinstance(payload, Sources):
                    sources, version = payload.sources, payload.index_version
                elif isinstance(payload, Error):
                    status = payload.status
                    raise ApiError(status, "unknown_index" if status == 404 else "failed", payload.message)
                elif isinstance(payload, Done):
                    done = finished_done(payload, started, predicted_wait_s)
                    return QueryResponse.from_done(done, request_id=request_id, sources=sources), version
        except EventTimeout as exc:
            raise ApiError(
                504, "timeout", f"no answer within {self._settings.request_timeout_s:.0f}s"
            ) from exc
        raise ApiError(500, "failed", "the event stream ended without an answer")


def finished_done(done: Done, started: float, predicted_wait_s: float | None) -> Done:
    """The worker's `done` with what only the API knows: its total time, admission's prediction."""
    update: dict[str, float] = {"total_ms": (time.perf_counter() - started) * 1000}
    if predicted_wait_s is not None and math.isfinite(predicted_wait_s):
        # Admission's prediction beside what happened (bench/overload.py compares them).
        update["predicted_wait_ms"] = predicted_wait_s * 1000
    return done.model_copy(update={"timings": done.timings.model_copy(update=update)})


def splice(request_id: str, body: bytes) -> bytes:
    """A cached body (stored without its request id) as this request's JSON response."""
    return b'{"request_id":"' + request_id.encode() + b'",' + body[1:]
