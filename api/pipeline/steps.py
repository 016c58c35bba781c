"""The pipeline's steps, in order, and what each is given (see :mod:`ragline.api.pipeline`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import asdict, replace
from typing import Any, Protocol

from ragline.api.errors import ApiError, unavailable
from ragline.api.pipeline.admission import Action, Admission, Decision
from ragline.api.pipeline.coalescer import Coalescer
from ragline.api.pipeline.context import KEYED, CacheSlot, Query, QueryContext, R
from ragline.api.pipeline.validate import JSON_TYPE, deadline_s, parse_body, query_of
from ragline.api.query.protocol import QueryRequest, QueryResponse
from ragline.broker import metrics
from ragline.broker.config.settings import ApiSettings, GenerationSettings, RetrievalSettings
from ragline.broker.contract.messages import Done, Error, RetrieveRequest, Sources, filter_key
from ragline.broker.limits.leases import REQUESTS, STREAMS, Lease
from ragline.broker.redis.keys import Keys
from ragline.broker.state.normalize import query_digest
from ragline.broker.state.result_cache import Lookup, Outcome
from ragline.broker.state.semantic_cache import scope_of
from ragline.broker.streams.events import Event, EventTimeout
from ragline.broker.tracing import propagation, traced

# Every background write (a cache store, a released claim, a cancel flag) is bounded by this.
_BACKGROUND_TIMEOUT_S = 5.0
log = logging.getLogger(__name__)

_NOT_DEGRADED = {"degraded": False, "degraded_reason": None, "notice": None}


def _keyed(q: Query) -> tuple[object, ...]:
    # A filter's key, not its repr: the same filter in another key order is the same answer.
    return tuple(filter_key(q.filter) if name == "filter" else getattr(q, name) for name in KEYED)


class ResultCache(Protocol):
    """What the pipeline needs of :class:`ragline.broker.state.result_cache.ResultCache`."""

    async def lookup(self, index: str, digest: str, *, request_id: str = "") -> Lookup: ...
    async def store(self, key: str, body: bytes, *, leader: str = "") -> bool: ...
    async def release(self, key: str, leader: str) -> None: ...


class SemanticCommits(Protocol):
    """What the pipeline needs of :class:`ragline.broker.state.semantic_cache.SemanticCommits`."""

    async def commit(self, request_id: str, scope: str, answer_key: str) -> bool: ...


# A batch of queries onto the retrieval queue (done when it is written).
Publish = Callable[[list[RetrieveRequest]], Awaitable[None]]
# A request's events after an id, until its final one (raises EventTimeout past the request timeout).
ReadEvents = Callable[[str, str], AsyncIterator[Event]]
# An index's current version, or None when it does not exist.
IndexVersion = Callable[[str], Awaitable[str | None]]
# Flag a request cancelled (its generation aborts).
Cancel = Callable[[str], Awaitable[None]]


class KeyLeases(Protocol):
    """What the pipeline needs of :class:`ragline.broker.limits.leases.Leases`."""

    async def acquire(self, kind: str, principal: str, cap: int) -> Lease: ...
    async def release(self, lease: Lease) -> None: ...


class StreamOwners(Protocol):
    """Who asked for each resumable stream: only they may read it again."""

    async def record(self, request_id: str, owner: str) -> None: ...
    async def owner_of(self, request_id: str) -> str | None: ...


def _overloaded(decision: Decision) -> ApiError:
    return ApiError(503, "overloaded", decision.message, headers={"Retry-After": str(decision.retry_after_s)})


class Pipeline:
    def __init__(
        self,
        settings: ApiSettings,
        retrieval: RetrievalSettings,
        generation: GenerationSettings,
        admission: Admission,
        *,
        keys: Keys,
        cache: ResultCache,
        publish: Publish,
        read_events: ReadEvents,
        index_version: IndexVersion,
        cancel: Cancel,
        owners: StreamOwners,
        leases: KeyLeases,
        retrieval_workers: Callable[[], int] = lambda: 1,
        semantic: SemanticCommits | None = None,
    ) -> None:
        self._settings = settings
        self._retrieval = retrieval
        # Its defaults and bounds for a request's sampling; its model is part of every answer's cache key.
        self._generation = generation
        self._model_id = generation.generation_model
        self._admission = admission
        self._cache = cache
        self._read_events = read_events
        self._index_version = index_version
        self._cancel = cancel
        self._owners = owners
        self._leases = leases
        self._keys = keys
        # The semantic cache (RAGLINE_SEMANTIC_CACHE): None when off.
        self._semantic = semantic
        self._background: set[asyncio.Task[object]] = set()
        self.coalescer: Coalescer[RetrieveRequest] = Coalescer(
            publish,
            window_s=settings.coalesce_window_ms / 1000,
            max_batch=settings.coalesce_max_batch,
            max_in_flight=retrieval_workers,
        )

    @property
    def settings(self) -> ApiSettings:
        return self._settings

    # -- the steps, in order ------------------------------------------------------------------

    def validate(
        self,
        body: bytes,
        *,
        request_id: str,
        model: type[R],
        content_type: str | None = JSON_TYPE,
        deadline_ms: str | None = None,
        single_flight: bool = False,
        principal: str = "anonymous",
        streamed: bool = False,
    ) -> QueryContext[R]:
        """The request as the pipeline's context, or a 4xx naming what is wrong (no I/O).
        ``content_type`` is the request's header (None: it sent none, refused with 415); a caller
        in this process, whose body is JSON, leaves the default."""
        request = parse_body(body, model, content_type)
        return self.context(
            request,
            request_id=request_id,
            deadline_ms=deadline_ms,
            single_flight=single_flight,
            principal=principal,
            streamed=streamed,
        )

    def context(
        self,
        request: R,
        *,
        request_id: str,
        deadline_ms: str | None = None,
        single_flight: bool = False,
        principal: str = "anonymous",
        streamed: bool = False,
    ) -> QueryContext[R]:
        """The validate step past the body's types: for an endpoint that reads a body of its own
        shape and builds the query request from it."""
        return QueryContext(
            request_id=request_id,
            request=request,
            query=query_of(request, self._settings, self._retrieval, self._generation),
            deadline_s=deadline_s(deadline_ms, self._settings),
            single_flight=single_flight,
            principal=principal,
            streamed=streamed,
        )

    @traced("ragline.result_cache", lambda self, ctx, **_: _cache_attributes(ctx))
    async def result_cache(self, ctx: QueryContext[Any]) -> None:
        """Look the answer up (404 for an unknown index); a hit lands in ``ctx.cached``."""
        q = ctx.asked
        claim = ctx.single_flight and self._computes(ctx)
        digest = self.digest(q)
        found = await self._cache.lookup(q.index, digest, request_id=ctx.request_id if claim else "")
        if found.outcome is Outcome.UNKNOWN_INDEX:
            raise _unknown_index(q.index)
        ctx.index_version = found.version
        if found.outcome is Outcome.HIT:
            metrics.CACHE_HITS.labels("result").inc()
            ctx.cached = found.body
            return
        metrics.CACHE_MISSES.labels("result").inc()
        if found.outcome is Outcome.FOLLOW:
            ctx.slot, ctx.source_id = None, found.leader
        else:
            key = found.key(self._keys, q.index, digest)
            ctx.slot, ctx.source_id = CacheSlot(key, found.version, found.outcome is Outcome.LEAD), ""

    @traced("ragline.index", lambda self, ctx, **_: {"ragline.index_version": ctx.index_version})
    async def index(self, ctx: QueryContext[Any]) -> None:
        """For requests that skip the result cache (jobs): the index's version, or 404."""
        version = await self._index_version(ctx.asked.index)
        if version is None:
            raise _unknown_index(ctx.asked.index)
        ctx.index_version = version

    @traced("ragline.admission", lambda self, ctx, **_: _admission_attributes(ctx))
    async def admission(self, ctx: QueryContext[Any], *, use_cache: bool = True) -> None:
        """Apply the decision taken before the cache step: 503, or retrieval-only (looked up in
        turn), or nothing to do."""
        decision = ctx.decision
        if decision.action is Action.ADMIT:
            return
        if decision.action is Action.REJECT:
            raise _overloaded(decision)
        ctx.query = replace(ctx.asked, mode="retrieval")
        if use_cache:
            await self.result_cache(ctx)

    @traced("ragline.hold")
    async def hold(self, ctx: QueryContext[Any]) -> None:
        """Take one of the caller's streams (an SSE request) or requests for as long as the
        request lasts; 429 past its key's cap (:class:`~ragline.broker.limits.leases.CapReached`), and a
        single-flight claim this request made is let go. A cache hit never gets here: it holds
        nothing."""
        s = self._settings
        kind, cap = (STREAMS, s.key_max_streams) if ctx.streamed else (REQUESTS, s.key_max_requests)
        if cap <= 0:
            return
        try:
            ctx.lease = await self._leases.acquire(kind, ctx.principal, cap)
        except BaseException:
            self._release(ctx)
            raise

    def let_go(self, ctx: QueryContext[Any]) -> None:
        """Release the request's lease, if it holds one (idempotent; callable from a closing
        generator or a finishing response)."""
        lease, ctx.lease = ctx.lease, None
        if lease is not None:
            # A release that fails leaves the lease to expire on its own.
            self._soon(self._leases.release(lease), "lease release")

    @traced("ragline.enqueue", lambda self, ctx, **_: {"ragline.source_id": ctx.source_id})
    async def enqueue(self, ctx: QueryContext[Any]) -> None:
        """Send the request to retrieval, coalesced with the queries in flight; a follower of a
        single flight sends nothing, it reads its leader's events."""
        if ctx.source_id:
            return
        q = ctx.asked
        ctx.source_id = ctx.request_id
        item = RetrieveRequest(
            **asdict(q),
            request_id=ctx.request_id,
            index_version=ctx.index_version,
            enqueued_at=time.time(),
            job_id=ctx.job_id,
            # The worker copies these into the stream's `done`, so an SSE resume sees them too.
            degraded=ctx.degradation,
            semantic_scope=self._semantic_scope(ctx),
        )
        propagation.remember(ctx.request_id)  # its trace goes on in the batch's task
        try:
            await self.coalescer.submit(item)
        except Exception as exc:
            self._release(ctx)
            log.warning("%s: could not enqueue: %r", ctx.request_id, exc)
            raise unavailable("could not enqueue the request: the task queue is not answering") from exc
        self._admission.admitted(q.mode, ctx.request_id)
        if ctx.job_id is not None:  # nobody here reads a job's events: its retrieval is not watched
            self.coalescer.settle(ctx.request_id)
            self._admission.retrieved(ctx.request_id)

    async def relay(self, ctx: QueryContext[Any], *, after: str = "0-0") -> AsyncGenerator[Event, None]:
        """The events that answer the request, each ``done`` completed (see :meth:`_completed`).

        Consume it to its end or close it (``contextlib.aclosing``): closing releases what the
        request holds (its place in the coalescer's batch, its single-flight claim)."""
        watching = ctx.source_id == ctx.request_id and after == "0-0" and ctx.query is not None
        sources: Sources | None = None
        answer: Done | None = None
        try:
            async for event in self._read_events(ctx.source_id, after):
                if watching:  # its retrieval answered: the batch is back, it is past retrieval
                    watching = False
                    self._settle(ctx.request_id)
                if isinstance(event.payload, Sources):
                    sources = event.payload
                elif isinstance(event.payload, Done):
                    answer = self._completed(ctx, event.payload)
                    event = Event(event.id, answer)
                yield event
        except EventTimeout:
            limit = self._settings.request_timeout_s
            raise ApiError(504, "timeout", f"no answer within {limit:.0f}s") from None
        finally:
            if watching:
                self._settle(ctx.request_id)
            self._remember(ctx, sources, answer)
            self.let_go(ctx)

    # -- composition ----------------------------------------------------------------------------

    async def start(self, ctx: QueryContext[Any]) -> None:
        """Every step before the events: afterwards the answer is in ``ctx.cached``, or the request
        is on its way and :meth:`relay` gives its events."""
        ctx.decision = self.decide(ctx)
        await self.result_cache(ctx)
        if ctx.cached is None:
            await self.admission(ctx)
        if ctx.cached is None:
            await self.hold(ctx)
            try:
                await self.enqueue(ctx)
            except BaseException:
                self.let_go(ctx)
                raise

    def decide(self, ctx: QueryContext[Any]) -> Decision:
        """Admission's decision for the request (no I/O); :meth:`admission` applies it."""
        assert ctx.request is not None
        return self._admission.decide(
            ctx.asked.mode, allow_degraded=ctx.request.allow_degraded, deadline_s=ctx.deadline_s
        )

    async def own(self, request_id: str, owner: str) -> None:
        """Let ``owner`` (and only them) read this request's stream again by its id."""
        try:
            await self._owners.record(request_id, owner)
        except Exception:
            # The answer is on its way; only a later resume by this id is lost (it would 404).
            log.warning("%s: could not record the stream's owner", request_id, exc_info=True)

    async def resumed(self, request_id: str, owner: str) -> QueryContext[QueryRequest]:
        """A context for reading an existing request's stream again (no query, no cache), holding
        one of the caller's streams; 404 at once for an id that is unknown, gone, or another
        caller's (the two look the same), 429 past the caller's cap on streams."""
        if await self._owners.owner_of(request_id) != owner:
            raise ApiError(404, "not_found", f"no stream {request_id!r} of yours to resume")
        ctx: QueryContext[QueryRequest] = QueryContext(
            request_id,
            request=None,
            query=None,
            deadline_s=0.0,
            source_id=request_id,
            principal=owner,
            streamed=True,
        )
        await self.hold(ctx)
        return ctx

    def cached_json(self, ctx: QueryContext[Any]) -> bytes:
        """The cached answer as this request's JSON response (with its degradation, if any)."""
        assert ctx.cached is not None
        body = splice(ctx.request_id, ctx.cached)
        degraded = ctx.degradation
        if degraded is None:
            return body
        hit = QueryResponse.model_validate_json(body)
        return hit.model_copy(update=dict(degraded)).model_dump_json().encode()

    def cancel_soon(self, request_id: str) -> None:
        """Flag ``request_id`` cancelled without awaiting (callable from a closing generator)."""
        self._soon(self._cancel(request_id), "cancel flag")

    async def aclose(self) -> None:
        for task in list(self._background):
            with contextlib.suppress(BaseException):
                await task

    # -- parts of the steps -------------------------------------------------------------------

    def digest(self, q: Query) -> str:
        """The digest in the cache key of ``q``'s answer."""
        return query_digest(q.query, *_keyed(q), self._model_id)

    @staticmethod
    def _computes(ctx: QueryContext[Any]) -> bool:
        """Whether the request will be computed in the mode it has now, so its lookup may claim
        the computation: admitted, or degraded and already retrieval-only. (A refused or
        not-yet-degraded request claims nothing, so it leaves no claim behind.)"""
        action = ctx.decision.action
        return action is Action.ADMIT or (action is Action.DEGRADE and ctx.asked.mode == "retrieval")

    def _settle(self, request_id: str) -> None:
        self.coalescer.settle(request_id)
        self._admission.retrieved(request_id)

    def _completed(self, ctx: QueryContext[Any], done: Done) -> Done:
        """The worker's ``done`` with what only the API knows: its total time, admission's
        prediction, and (a follower of a plain leader) why this request was degraded."""
        timings: dict[str, float] = {"total_ms": (time.perf_counter() - ctx.started) * 1000}
        wait = ctx.decision.wait_s
        if wait is not None and math.isfinite(wait):
            # Admission's prediction beside what happened (bench/overload.py compares them).
            timings["predicted_wait_ms"] = wait * 1000
        update: dict[str, Any] = {"timings": done.timings.model_copy(update=timings)}
        if (degraded := ctx.degradation) is not None:
            update.update(degraded)
        return done.model_copy(update=update)

    def _remember(self, ctx: QueryContext[Any], sources: Sources | None, done: Done | None) -> None:
        """Store an answer computed on the version its key names (a re-ingest may have raced); else
        release the claim. Off the answer's path: followers read the leader's stream, not the cache."""
        slot = ctx.slot
        if slot is None:
            return
        # A semantic hit is another question's answer: never stored as this question's own.
        if done is None or sources is None or sources.index_version != slot.version or done.cached:
            self._release(ctx)
            return
        # Stored as a plain answer of its mode: a degraded request was a retrieval request.
        plain = done.model_copy(update={"cached": True, **_NOT_DEGRADED})
        stored = QueryResponse.from_done(plain, request_id="", sources=sources.sources)
        body = stored.model_dump_json(exclude={"request_id"}).encode()
        leader = ctx.request_id if slot.leading else ""
        # Only a plain answer may answer other questions: never a degraded or partial one.
        scope = None if done.degraded or done.partial else self._semantic_scope(ctx)
        self._soon(self._store(ctx.request_id, slot.key, body, leader, scope), "cache write")
        ctx.slot = None

    async def _store(self, request_id: str, key: str, body: bytes, leader: str, scope: str | None) -> None:
        """Store the answer, then remember its question in the semantic cache (its entry points
        at the answer, so only once the answer is stored)."""
        stored = await self._cache.store(key, body, leader=leader)
        if stored and scope is not None and self._semantic is not None:
            await self._semantic.commit(request_id, scope, key)

    def _semantic_scope(self, ctx: QueryContext[Any]) -> str | None:
        """The semantic cache's scope of the request (None: it is off, or the request is a job,
        which skips the caches): everything its answer depends on but its question's text."""
        if self._semantic is None or ctx.job_id is not None:
            return None
        q = ctx.asked
        tenant = "" if self._retrieval.semantic_cache_across_keys else ctx.principal
        return scope_of(tenant, q.index, ctx.index_version, (*_keyed(q), self._model_id))

    def _release(self, ctx: QueryContext[Any]) -> None:
        slot, ctx.slot = ctx.slot, None
        if slot is not None and slot.leading:
            self._soon(self._cache.release(slot.key, ctx.request_id), "single-flight release")

    def _soon(self, work: Awaitable[object], what: str) -> None:
        """Run ``work`` in the background, bounded; a failure is logged, not raised."""

        async def bounded() -> None:
            try:
                async with asyncio.timeout(_BACKGROUND_TIMEOUT_S):
                    await work
            except Exception:
                log.warning("background %s failed", what, exc_info=True)

        task = asyncio.get_running_loop().create_task(bounded())
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _unknown_index(index: str) -> ApiError:
    return ApiError(404, "unknown_index", f"index {index!r} does not exist; ingest it first")


def error_of(event: Error) -> ApiError:
    """A worker's ``error`` event as the JSON answer's error."""
    code = {404: "unknown_index", 499: "cancelled", 504: "timeout"}.get(event.status, "failed")
    return ApiError(event.status, code, event.message)


def splice(request_id: str, body: bytes) -> bytes:
    """A cached body (stored without its request id) as this request's JSON response."""
    return b'{"request_id":"' + request_id.encode() + b'",' + body[1:]


def _cache_attributes(ctx: QueryContext[Any]) -> dict[str, str]:
    """What the result cache step found, on its span."""
    outcome = "hit" if ctx.cached is not None else "follow" if ctx.source_id else "miss"
    return {"ragline.cache": outcome, "ragline.index_version": ctx.index_version}


def _admission_attributes(ctx: QueryContext[Any]) -> dict[str, str | float]:
    """Admission's decision, on its span."""
    d = ctx.decision
    described: dict[str, str | float] = {"ragline.admission": d.action.value, "ragline.mode": ctx.asked.mode}
    if d.reason:
        described["ragline.admission.reason"] = d.reason
    if d.wait_s is not None and math.isfinite(d.wait_s):
        described["ragline.predicted_wait_s"] = d.wait_s
    return described
