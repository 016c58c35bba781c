"""The pipeline's steps on narrow fakes (a result cache, a publisher, an event reader): validate,
result cache, admission, enqueue or coalesce, relay, and the JSON and SSE renderers. No Redis, no
workers: a change to the hot path is checked here in seconds; tests/api/query/test_query.py and
tests/api/test_done_contract.py check the same path on real parts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
import redis
from ragline.api.errors import ApiError, api_error
from ragline.api.jobs.protocol import JobRequest
from ragline.api.pipeline import Pipeline, QueryContext
from ragline.api.pipeline.admission import ADMIT, Action, Decision
from ragline.api.query.protocol import QueryRequest, QueryResponse
from ragline.api.query.render import json_answer, sse_answer
from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import (
    Done,
    Error,
    RetrieveRequest,
    SemanticMatch,
    Source,
    Sources,
    Timings,
    Token,
    Usage,
)
from ragline.broker.limits.leases import REQUESTS, STREAMS, CapReached, Lease
from ragline.broker.redis.keys import Keys
from ragline.broker.state.result_cache import Lookup, Outcome
from ragline.broker.streams.events import Event, EventTimeout

T = TypeVar("T")
SETTINGS = Settings().replace(
    default_index="docs", default_deadline_ms=30_000, min_deadline_ms=100, max_deadline_ms=180_000
)
SOURCE = Source(chunk_id="c1", source="cafe.md", title="Café", text="Opens at 7:15.", score=0.9)
DEGRADE = Decision(Action.DEGRADE, "generation_busy", "Generation is busy", wait_s=0.2)
REJECT = Decision(Action.REJECT, "retrieval_busy", "overloaded: retrieval is busy", retry_after_s=7)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class FakeCache:
    """The result cache's outcomes from dicts: which indexes exist, what is stored, who claims."""

    def __init__(self) -> None:
        self.versions = {"docs": "v1"}
        self.bodies: dict[str, bytes] = {}
        self.claims: dict[str, str] = {}
        self.lookups: list[tuple[str, str]] = []  # (key, request_id claiming or "")
        self.released: list[str] = []

    def key(self, index: str, digest: str) -> str:
        return Lookup(Outcome.MISS, self.versions[index]).key(Keys(SETTINGS.redis.key_prefix), index, digest)

    async def lookup(self, index: str, digest: str, *, request_id: str = "") -> Lookup:
        version = self.versions.get(index)
        if version is None:
            return Lookup(Outcome.UNKNOWN_INDEX)
        key = self.key(index, digest)
        self.lookups.append((key, request_id))
        if key in self.bodies:
            return Lookup(Outcome.HIT, version, body=self.bodies[key])
        if not request_id:
            return Lookup(Outcome.MISS, version)
        leader = self.claims.setdefault(key, request_id)
        if leader == request_id:
            return Lookup(Outcome.LEAD, version)
        return Lookup(Outcome.FOLLOW, version, leader=leader)

    async def store(self, key: str, body: bytes, *, leader: str = "") -> bool:
        self.bodies[key] = body
        if leader and self.claims.get(key) == leader:
            del self.claims[key]
        return True

    async def release(self, key: str, leader: str) -> None:
        self.released.append(key)
        if self.claims.get(key) == leader:
            del self.claims[key]


class FakeQueue:
    """The publisher: records each batch; fails when told to."""

    def __init__(self) -> None:
        self.batches: list[list[RetrieveRequest]] = []
        self.failure: Exception | None = None

    async def __call__(self, items: list[RetrieveRequest]) -> None:
        if self.failure is not None:
            raise self.failure
        self.batches.append(items)

    @property
    def sent(self) -> list[RetrieveRequest]:
        return [item for batch in self.batches for item in batch]


class FakeStreams:
    """The event reader: each request's events (or an exception to raise) in order."""

    def __init__(self) -> None:
        self.streams: dict[str, list[Event | BaseException]] = {}
        self.read: list[tuple[str, str]] = []

    def answer(
        self, request_id: str, *, answer: str | None = "At 7:15.", version: str = "v1", **done: Any
    ) -> None:
        events: list[Event | BaseException] = [Event("1-0", Sources(sources=[SOURCE], index_version=version))]
        if answer:
            events.append(Event("2-0", Token(text=answer)))
        timings = Timings(queue_ms=1.0, retrieval_ms=2.0, generation_ms=3.0 if answer else 0.0)
        usage = Usage(prompt_tokens=10, completion_tokens=4) if answer else None
        events.append(Event("3-0", Done(answer=answer, usage=usage, timings=timings, **done)))
        self.streams[request_id] = events

    async def __call__(self, request_id: str, after: str) -> AsyncIterator[Event]:
        self.read.append((request_id, after))
        for item in self.streams.get(request_id, [EventTimeout(request_id)]):
            if isinstance(item, BaseException):
                raise item
            if _after(item.id, after):
                yield item


def _after(event_id: str, after: str) -> bool:
    return tuple(map(int, event_id.split("-"))) > tuple(map(int, after.split("-")))


@dataclass
class FixedAdmission:
    """Admission that decides what it is told, and records what it is told back."""

    decision: Decision = ADMIT
    enqueued: list[tuple[str, str]] = field(default_factory=list)
    past_retrieval: list[str] = field(default_factory=list)

    def decide(self, mode: str, *, allow_degraded: bool, deadline_s: float) -> Decision:
        return self.decision

    def admitted(self, mode: str, request_id: str) -> None:
        self.enqueued.append((mode, request_id))

    def retrieved(self, request_id: str) -> None:
        self.past_retrieval.append(request_id)


class FakeOwners:
    def __init__(self) -> None:
        self.owners: dict[str, str] = {}

    async def record(self, request_id: str, owner: str) -> None:
        self.owners[request_id] = owner

    async def owner_of(self, request_id: str) -> str | None:
        return self.owners.get(request_id)


class FakeLeases:
    """Each key's leases in a dict; refuses past the cap like broker/limits/leases.py."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, str], set[str]] = {}
        self.taken = 0

    async def acquire(self, kind: str, principal: str, cap: int) -> Lease:
        held = self.held.setdefault((kind, principal), set())
        if len(held) >= cap:
            raise CapReached(kind, cap)
        self.taken += 1
        lease = Lease(f"{kind}:{principal}", f"lease-{self.taken}")
        held.add(lease.lease_id)
        return lease

    async def release(self, lease: Lease) -> None:
        kind, principal = lease.key.split(":")
        self.held[(kind, principal)].discard(lease.lease_id)

    def count(self, kind: str, principal: str = "anonymous") -> int:
        return len(self.held.get((kind, principal), ()))


@dataclass
class Parts:
    pipeline: Pipeline
    cache: FakeCache
    queue: FakeQueue
    streams: FakeStreams
    admission: FixedAdmission
    cancelled: list[str]
    leases: FakeLeases


class FakeSemantic:
    """The semantic cache's commits: what was remembered, and in which scope."""

    def __init__(self) -> None:
        self.commits: list[tuple[str, str, str]] = []  # (request id, scope, answer key)

    async def commit(self, request_id: str, scope: str, answer_key: str) -> bool:
        self.commits.append((request_id, scope, answer_key))
        return True


def parts(
    decision: Decision = ADMIT, settings: Settings = SETTINGS, semantic: FakeSemantic | None = None
) -> Parts:
    cache, queue, streams, cancelled, leases = FakeCache(), FakeQueue(), FakeStreams(), [], FakeLeases()
    admission = FixedAdmission(decision)

    async def index_version(index: str) -> str | None:
        return cache.versions.get(index)

    async def cancel(request_id: str) -> None:
        cancelled.append(request_id)

    pipeline = Pipeline(
        settings.api,
        settings.retrieval,
        SETTINGS.generation,
        admission,  # type: ignore[arg-type]
        keys=Keys(SETTINGS.redis.key_prefix),
        cache=cache,
        publish=queue,
        read_events=streams,
        index_version=index_version,
        cancel=cancel,
        owners=FakeOwners(),
        leases=leases,
        semantic=semantic,
    )
    return Parts(pipeline, cache, queue, streams, admission, cancelled, leases)


def context(p: Parts, body: dict[str, Any], *, request_id: str = "r1", **kwargs: Any) -> QueryContext[Any]:
    kwargs.setdefault("single_flight", True)
    return p.pipeline.validate(json.dumps(body).encode(), request_id=request_id, model=QueryRequest, **kwargs)


async def answered(p: Parts, body: dict[str, Any], *, request_id: str = "r1") -> dict[str, Any]:
    """The JSON answer, once the pipeline's background writes (cache store, release) are done."""
    answer = await json_answer(p.pipeline, context(p, body, request_id=request_id))
    await p.pipeline.aclose()
    return json.loads(answer)


# -- validate -------------------------------------------------------------------------------------


JSON = "application/json"


@pytest.mark.parametrize(
    ("raw", "content_type", "status", "needle"),
    [
        (b'{"query": ""}', JSON, 422, "empty"),
        (b'{"query": "  \\n "}', JSON, 422, "empty"),
        (json.dumps({"query": "x" * 4097}).encode(), JSON, 422, "4096"),
        (b'{"query": "ok", "top_k": 0}', JSON, 422, "top_k"),
        (b'{"query": "ok", "top_k": "5"}', JSON, 422, "top_k"),
        (b'{"query": "ok", "index": "../etc"}', JSON, 422, "index"),
        (b'{"query": "ok", "index": ".."}', JSON, 422, "index"),
        (b'{"query": "ok", "ef_search": 100000}', JSON, 422, "ef_search"),
        (b'{"query": "ok", "colour": "red"}', JSON, 422, "colour"),
        (b"[]", JSON, 422, "body"),
        (b'{"query": ', "application/json", 400, "JSON"),
        (b'{"query": "ok"}', "text/plain", 415, "Content-Type: application/json"),
        # No type at all: a page elsewhere may send that without a preflight.
        (b'{"query": "ok"}', None, 415, "got none"),
    ],
)
def test_validate_refuses_bad_bodies_with_a_message(
    raw: bytes, content_type: str | None, status: int, needle: str
) -> None:
    with pytest.raises(ApiError) as refused:
        parts().pipeline.validate(raw, request_id="r", model=QueryRequest, content_type=content_type)
    assert refused.value.status == status and needle in refused.value.message


def test_validate_takes_json_of_any_json_type_and_the_endpoints_model() -> None:
    p = parts()
    ctx = p.pipeline.validate(
        b'{"query": " When? ", "webhook_url": "https://example.com/h"}',
        request_id="r",
        model=JobRequest,
        content_type="application/vnd.api+json; charset=utf-8",
    )
    assert (
        ctx.asked.query == "When?"
        and ctx.asked.index == "docs"
        and ctx.asked.top_k == SETTINGS.api.default_top_k
    )
    assert isinstance(ctx.request, JobRequest) and ctx.request.webhook_url == "https://example.com/h"


@pytest.mark.parametrize(
    ("header", "expected"), [(None, 30.0), ("5000", 5.0), ("1", 0.1), (str(10**9), 180.0)]
)
def test_the_deadline_is_clamped_in_the_validate_step(header: str | None, expected: float) -> None:
    assert context(parts(), {"query": "q"}, deadline_ms=header).deadline_s == pytest.approx(expected)


@pytest.mark.parametrize("header", ["0", "-5", "5s", "", "١٢"])
def test_a_malformed_deadline_is_422(header: str) -> None:
    with pytest.raises(ApiError) as refused:
        context(parts(), {"query": "q"}, deadline_ms=header)
    assert refused.value.status == 422 and "X-Request-Deadline-Ms" in refused.value.message


# -- the JSON answer through every step -------------------------------------------------------


def test_a_miss_is_enqueued_relayed_and_cached() -> None:
    p = parts(Decision(Action.ADMIT, wait_s=1.5))
    p.streams.answer("r1")
    answer = run(answered(p, {"query": "When does it open?", "top_k": 3}))

    (item,) = p.queue.sent
    assert (item.request_id, item.query, item.top_k, item.mode, item.index, item.index_version) == (
        "r1",
        "When does it open?",
        3,
        "rag",
        "docs",
        "v1",
    )
    assert answer["request_id"] == "r1" and answer["answer"] == "At 7:15." and answer["cached"] is False
    assert set(Done.model_fields) <= answer.keys() and answer["sources"][0]["chunk_id"] == "c1"
    assert answer["timings"]["total_ms"] > 0 and answer["timings"]["predicted_wait_ms"] == 1500
    assert p.admission.enqueued == [("rag", "r1")] and p.admission.past_retrieval == ["r1"]
    assert p.pipeline.coalescer.batches_in_flight == 0  # its batch came back

    # It claimed the computation, then stored the answer as a cached answer (without its id).
    ((key, claimed),) = p.cache.lookups
    assert claimed == "r1" and key not in p.cache.claims
    stored = json.loads(p.cache.bodies[key])
    assert stored["cached"] is True and "request_id" not in stored and stored["answer"] == "At 7:15."


def test_a_hit_is_served_whatever_the_load_and_touches_no_queue() -> None:
    p = parts()
    p.streams.answer("r1")
    first = run(answered(p, {"query": "When does it open?"}))
    p.admission.decision = REJECT
    hit = run(answered(p, {"query": "when does it open", "mode": "rag"}, request_id="r2"))
    assert hit["request_id"] == "r2" and hit["cached"] is True and hit["answer"] == first["answer"]
    assert len(p.queue.sent) == 1 and p.streams.read == [("r1", "0-0")]
    assert p.cache.lookups[-1][1] == ""  # refused: it claimed nothing


def test_an_identical_concurrent_request_follows_the_leaders_events() -> None:
    p = parts()
    p.cache.claims[p.cache.key("docs", p.pipeline.digest(context(p, {"query": "q"}).asked))] = "leader"
    p.streams.answer("leader")
    answer = run(answered(p, {"query": "q"}, request_id="r2"))
    assert answer["request_id"] == "r2" and answer["answer"] == "At 7:15."
    assert p.queue.sent == [] and p.streams.read == [("leader", "0-0")]
    assert p.cache.bodies == {}  # the leader stores it


def test_a_refused_request_is_503_with_retry_after_and_leaves_nothing_behind() -> None:
    p = parts(REJECT)
    with pytest.raises(ApiError) as refused:
        run(answered(p, {"query": "q"}))
    assert (refused.value.status, refused.value.headers) == (503, {"Retry-After": "7"})
    assert p.queue.sent == [] and p.cache.claims == {} and p.cache.lookups[0][1] == ""


def test_a_degraded_request_is_computed_retrieval_only_and_cached_as_a_plain_answer() -> None:
    p = parts(DEGRADE)
    p.streams.answer("r1", answer=None)
    answer = run(answered(p, {"query": "q"}))
    (item,) = p.queue.sent
    assert item.mode == "retrieval" and item.degraded is not None
    assert item.degraded.degraded_reason == "generation_busy"
    assert (
        answer["degraded"] is True and answer["notice"] == "Generation is busy" and answer["answer"] is None
    )
    # The RAG key was looked up without a claim; the retrieval key claimed and then stored.
    (rag_key, rag_claim), (retrieval_key, retrieval_claim) = p.cache.lookups
    assert rag_key != retrieval_key and (rag_claim, retrieval_claim) == ("", "r1")
    stored = json.loads(p.cache.bodies[retrieval_key])
    assert stored["degraded"] is False and stored["notice"] is None

    # A plain retrieval request gets that answer as it is; a degraded one, marked degraded.
    p.admission.decision = ADMIT
    plain = run(answered(p, {"query": "q", "mode": "retrieval"}, request_id="r2"))
    assert plain["cached"] is True and plain["degraded"] is False
    p.admission.decision = DEGRADE
    marked = run(answered(p, {"query": "q"}, request_id="r3"))
    assert (
        marked["cached"] is True
        and marked["degraded"] is True
        and marked["degraded_reason"] == "generation_busy"
    )
    assert len(p.queue.sent) == 1


def test_an_answer_computed_on_another_index_version_is_not_cached() -> None:
    p = parts()
    p.streams.answer("r1", version="v0")  # re-ingested while it was computed
    run(answered(p, {"query": "q"}))
    assert p.cache.bodies == {} and p.cache.claims == {} and len(p.cache.released) == 1


@pytest.mark.parametrize(
    ("stream", "status"),
    [
        ([Event("1-0", Error(status=404, message="no index 'docs'"))], 404),
        ([Event("1-0", Error(status=500, message="the engine died"))], 500),
        ([EventTimeout("r1")], 504),
        ([Event("1-0", Sources(sources=[SOURCE])), redis.ConnectionError("Connection reset by peer")], 503),
    ],
)
def test_a_failed_answer_is_an_error_and_releases_the_claim(stream: list[Any], status: int) -> None:
    p = parts()
    p.streams.streams["r1"] = stream
    with pytest.raises(Exception) as failed:
        run(answered(p, {"query": "q"}))
    assert api_error(failed.value).status == status
    run(p.pipeline.aclose())
    assert p.cache.claims == {} and p.cache.bodies == {} and p.pipeline.coalescer.batches_in_flight == 0


def test_a_queue_that_does_not_answer_is_503_and_releases_the_claim() -> None:
    p = parts()
    p.queue.failure = TimeoutError("Redis did not answer an LPUSH within 5.0s")
    with pytest.raises(ApiError) as refused:
        run(answered(p, {"query": "q"}))
    assert refused.value.status == 503 and refused.value.headers["Retry-After"]
    assert "LPUSH" not in refused.value.message  # a clear message, not the exception
    assert p.cache.claims == {} and p.admission.enqueued == []


def test_an_unknown_index_is_404_for_every_endpoint() -> None:
    p = parts()
    with pytest.raises(ApiError) as missing:
        run(answered(p, {"query": "q", "index": "nope"}))
    assert missing.value.status == 404 and "nope" in missing.value.message
    ctx = p.pipeline.validate(b'{"query": "q", "index": "nope"}', request_id="j", model=JobRequest)
    with pytest.raises(ApiError) as missing:
        run(p.pipeline.index(ctx))
    assert missing.value.status == 404


# -- SSE ------------------------------------------------------------------------------------------


async def streamed(
    p: Parts, ctx: QueryContext[Any], *, abort_on_disconnect: bool = True
) -> list[tuple[str, dict]]:
    await p.pipeline.start(ctx)
    frames = [f async for f in sse_answer(p.pipeline, ctx, abort_on_disconnect=abort_on_disconnect)]
    await p.pipeline.aclose()
    events = []
    for chunk in frames:
        lines = dict(line.split(": ", 1) for line in chunk.decode().strip().splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_a_stream_relays_each_event_and_caches_the_answer() -> None:
    p = parts()
    p.streams.answer("r1")
    events = run(streamed(p, context(p, {"query": "q"}, single_flight=False)))
    assert [e for e, _ in events] == ["sources", "token", "done"]
    done = events[-1][1]
    assert done["request_id"] == "r1" and done["answer"] == "At 7:15." and done["timings"]["total_ms"] > 0
    assert p.cache.lookups[0][1] == "" and len(p.cache.bodies) == 1  # no single flight, still cached

    replayed = run(streamed(p, context(p, {"query": "q"}, request_id="r2", single_flight=False)))
    assert [e for e, _ in replayed] == ["sources", "token", "done"]
    assert replayed[-1][1]["cached"] is True and replayed[-1][1]["request_id"] == "r2"
    assert replayed[1][1]["text"] == "At 7:15."


def test_a_stream_whose_redis_fails_ends_with_an_error_event_and_cancels() -> None:
    p = parts()
    p.streams.streams["r1"] = [Event("1-0", Sources(sources=[SOURCE])), redis.ConnectionError("reset")]
    events = run(streamed(p, context(p, {"query": "q"}, single_flight=False)))
    assert [e for e, _ in events] == ["sources", "error"]
    assert events[-1][1]["status"] == 503 and "Redis" in events[-1][1]["message"]
    assert p.cancelled == ["r1"]  # nobody reads its answer any more: stop generating it


# -- jobs -----------------------------------------------------------------------------------------


def job_context(p: Parts, body: dict[str, Any]) -> QueryContext[JobRequest]:
    ctx = p.pipeline.validate(json.dumps(body).encode(), request_id="j1", model=JobRequest)
    ctx.job_id = ctx.request_id
    return ctx


async def submitted(p: Parts, ctx: QueryContext[Any]) -> None:
    """The pipeline's part of POST /v1/jobs (api/jobs/service.py stores the record between these)."""
    ctx.decision = p.pipeline.decide(ctx)
    await p.pipeline.index(ctx)
    await p.pipeline.admission(ctx, use_cache=False)
    await p.pipeline.enqueue(ctx)


def test_a_job_goes_through_admission_like_a_query() -> None:
    p = parts()
    ctx = job_context(p, {"query": "q"})
    run(submitted(p, ctx))
    (item,) = p.queue.sent
    assert item.job_id == "j1" and item.mode == "rag" and item.index_version == "v1"
    assert p.admission.past_retrieval == ["j1"]  # nobody here watches a job's retrieval
    assert p.cache.lookups == [] and ctx.answered_as == "job"

    p = parts(DEGRADE)
    ctx = job_context(p, {"query": "q"})
    run(submitted(p, ctx))
    assert p.queue.sent[0].mode == "retrieval" and p.queue.sent[0].degraded is not None

    p = parts(REJECT)
    with pytest.raises(ApiError) as refused:
        run(submitted(p, job_context(p, {"query": "q"})))
    assert refused.value.status == 503 and p.queue.sent == []


def test_redis_errors_are_503_with_retry_after_and_no_repr() -> None:
    for exc in (
        redis.ConnectionError("Error 111 connecting"),
        redis.TimeoutError("Timeout reading"),
        ConnectionRefusedError(),  # the task queue's own connection
        TimeoutError(),
    ):
        error = api_error(exc)
        assert (error.status, error.headers["Retry-After"]) == (503, "1")
        assert "Redis" in error.message and "Error" not in error.message
    assert api_error(ValueError("boom")).status == 500


def test_the_json_answer_is_the_response_model() -> None:
    p = parts()
    p.streams.answer("r1", early_exit=True, sources_dropped=2)
    answer = run(answered(p, {"query": "q"}))
    assert QueryResponse.model_validate(answer).early_exit is True and answer["sources_dropped"] == 2


def test_a_stream_is_resumed_by_its_owner_only() -> None:
    p = parts()

    async def go() -> None:
        await p.pipeline.own("r1", "key_a")
        assert (await p.pipeline.resumed("r1", "key_a")).source_id == "r1"
        for request_id, caller in (("r1", "key_b"), ("never-asked", "key_a")):
            with pytest.raises(ApiError) as refused:
                await p.pipeline.resumed(request_id, caller)
            assert refused.value.status == 404  # another's and an unknown one look the same

    asyncio.run(go())


# -- per-key caps (the hold step) ---------------------------------------------------------------

CAPPED = SETTINGS.replace(key_max_requests=1, key_max_streams=1)


def test_a_request_holds_a_lease_while_it_waits_and_lets_go_when_answered() -> None:
    p = parts(settings=CAPPED)
    p.streams.answer("r1")

    async def go() -> None:
        ctx = context(p, {"query": "q"})
        await p.pipeline.start(ctx)
        assert p.leases.count(REQUESTS) == 1
        with pytest.raises(CapReached):  # the key's one request is taken
            await p.pipeline.start(context(p, {"query": "other"}, request_id="r2"))
        # The refused request let its single-flight claim go; it enqueued nothing.
        await p.pipeline.aclose()
        assert len(p.cache.claims) == 1 and [i.request_id for i in p.queue.sent] == ["r1"]
        await json_answer(p.pipeline, context(p, {"query": "third"}, request_id="r3", principal="key_b"))
        async for _ in p.pipeline.relay(ctx):
            pass
        await p.pipeline.aclose()
        assert p.leases.count(REQUESTS) == 0 and p.leases.count(REQUESTS, "key_b") == 0

    p.streams.answer("r3")
    run(go())
    assert api_error(CapReached(REQUESTS, 1)).status == 429


def test_a_cache_hit_holds_nothing() -> None:
    p = parts(settings=CAPPED)
    p.streams.answer("r1")
    run(answered(p, {"query": "q"}))
    p.leases.held[(REQUESTS, "anonymous")] = {"someone-else"}  # the key is at its cap
    hit = run(answered(p, {"query": "q"}, request_id="r2"))
    assert hit["cached"] is True and p.leases.taken == 1


def test_streams_and_resumes_count_against_the_streams_cap() -> None:
    p = parts(settings=CAPPED)
    p.streams.answer("r1")

    async def go() -> None:
        ctx = context(p, {"query": "q"}, single_flight=False, streamed=True)
        await p.pipeline.start(ctx)
        await p.pipeline.own("r1", "anonymous")
        assert (p.leases.count(STREAMS), p.leases.count(REQUESTS)) == (1, 0)
        with pytest.raises(CapReached):
            await p.pipeline.resumed("r1", "anonymous")
        frames = [f async for f in sse_answer(p.pipeline, ctx, abort_on_disconnect=False)]
        await p.pipeline.aclose()
        assert len(frames) == 3 and p.leases.count(STREAMS) == 0
        resumed = await p.pipeline.resumed("r1", "anonymous")
        assert p.leases.count(STREAMS) == 1
        p.pipeline.let_go(resumed)  # what the response does when it closes, begun or not
        p.pipeline.let_go(resumed)  # and again, from the stream's own end: once is released
        await p.pipeline.aclose()
        assert p.leases.count(STREAMS) == 0

    run(go())


def test_a_request_whose_enqueue_fails_lets_its_lease_go() -> None:
    p = parts(settings=CAPPED)
    p.queue.failure = TimeoutError("Redis did not answer an LPUSH within 5.0s")
    with pytest.raises(ApiError):
        run(answered(p, {"query": "q"}))
    assert p.leases.count(REQUESTS) == 0


# -- the semantic cache ---------------------------------------------------------------------------


def test_with_the_semantic_cache_off_a_request_carries_no_scope_and_nothing_is_remembered() -> None:
    p = parts()
    p.streams.answer("r1")
    run(answered(p, {"query": "q"}))
    assert p.queue.sent[0].semantic_scope is None


def _scope(p: Parts, body: dict[str, Any], principal: str = "key_a", request_id: str = "r1") -> str | None:
    run(submitted(p, context(p, body, request_id=request_id, principal=principal)))
    return p.queue.sent[-1].semantic_scope


def test_the_scope_is_the_key_the_index_version_and_every_option_but_the_text() -> None:
    p = parts(semantic=FakeSemantic())
    base = _scope(p, {"query": "How do I sort a list?"})
    assert base is not None
    assert _scope(p, {"query": "Which method sorts a list?"}, request_id="r2") == base
    others = [
        _scope(p, {"query": "q"}, principal="key_b", request_id="r3"),
        _scope(p, {"query": "q", "mode": "retrieval"}, request_id="r4"),
        _scope(p, {"query": "q", "top_k": 3}, request_id="r5"),
        _scope(p, {"query": "q", "filter": {"path": "faq"}}, request_id="r6"),
        _scope(p, {"query": "q", "max_tokens": 10}, request_id="r7"),
    ]
    assert base not in others and len(set(others)) == len(others)
    p.cache.versions["docs"] = "v2"  # re-ingested: a scope of its own
    assert _scope(p, {"query": "q"}, request_id="r8") not in [base, *others]

    shared = parts(settings=SETTINGS.replace(semantic_cache_across_keys=True), semantic=FakeSemantic())
    assert _scope(shared, {"query": "q"}, principal="key_a") == _scope(
        shared, {"query": "q"}, principal="key_b", request_id="r2"
    )


def test_a_plain_answer_once_stored_is_remembered_under_its_answers_key() -> None:
    semantic = FakeSemantic()
    p = parts(semantic=semantic)
    p.streams.answer("r1")
    run(answered(p, {"query": "q"}))
    ((key, _),) = p.cache.lookups
    [(request_id, scope, answer_key)] = semantic.commits
    assert (request_id, scope, answer_key) == ("r1", p.queue.sent[0].semantic_scope, key)
    assert key in p.cache.bodies


@pytest.mark.parametrize(
    ("decision", "done"),
    [(DEGRADE, {"answer": None}), (ADMIT, {"partial": True, "partial_shards": ["docs.shard-1"]})],
    ids=["degraded", "partial"],
)
def test_a_degraded_or_partial_answer_is_never_remembered(decision: Decision, done: dict[str, Any]) -> None:
    semantic = FakeSemantic()
    p = parts(decision, semantic=semantic)
    p.streams.answer("r1", **done)
    run(answered(p, {"query": "q"}))
    assert semantic.commits == []


def test_an_error_is_never_stored_nor_remembered() -> None:
    semantic = FakeSemantic()
    p = parts(semantic=semantic)
    p.streams.streams["r1"] = [Event("1-0", Error(status=500, message="the engine died"))]
    with pytest.raises(ApiError):
        run(answered(p, {"query": "q"}))
    run(p.pipeline.aclose())
    assert semantic.commits == [] and p.cache.bodies == {}


def test_a_semantic_hit_is_relayed_marked_and_never_stored_as_the_questions_own() -> None:
    semantic = FakeSemantic()
    p = parts(semantic=semantic)
    match = SemanticMatch(question="How do I sort a list in place?", similarity=0.997)
    p.streams.answer("r1", cached="semantic", semantic_match=match)
    answer = run(answered(p, {"query": "how to sort a list in place"}))
    assert answer["cached"] == "semantic"
    assert answer["semantic_match"] == {"question": "How do I sort a list in place?", "similarity": 0.997}
    assert p.cache.bodies == {} and p.cache.claims == {} and len(p.cache.released) == 1
    assert semantic.commits == []


def test_a_job_carries_no_scope() -> None:
    p = parts(semantic=FakeSemantic())
    run(submitted(p, job_context(p, {"query": "q"})))
    assert p.queue.sent[0].semantic_scope is None
