"""Job records on a real Redis: idempotent create, forward-only stages, one final result."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import hashlib
import json
import time
import uuid
from typing import Literal

import pytest
import redis
import redis.asyncio as aioredis
from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import (
    Cancelled,
    Done,
    Error,
    Source,
    Sources,
    Timings,
    Token,
    Usage,
    decode_event,
)
from ragline.broker.contract.records import JobQuery, JobRecord, JobView
from ragline.broker.contract.requests import JobRequest
from ragline.broker.limits.leases import UNFINISHED_JOBS, CapReached
from ragline.broker.redis.keys import Keys
from ragline.broker.state import jobs
from ragline.broker.streams.events import EventWriter

PREFIX = "ragline-test-jobs"
KEYS = Keys(PREFIX)


@pytest.fixture
def cfg(redis_url: str) -> Settings:
    return Settings().replace(redis_url=redis_url, key_prefix=PREFIX, job_ttl_s=120, event_stream_ttl_s=60)


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


SOURCE = Source(chunk_id="c1", source="s.md", title="t", text="t", score=0.5)


def _record(
    job_id: str,
    *,
    mode: Literal["rag", "retrieval"] = "rag",
    webhook: str | None = "https://hooks.example.com/x",
) -> JobRecord:
    return jobs.new_record(
        job_id=job_id,
        owner="alice",
        request=JobRequest(
            query="q", top_k=3, mode=mode, index="test", webhook_url=webhook, metadata={"ticket": 7}
        ),
        now=time.time(),
    )


def _create(cfg: Settings, record: JobRecord, idempotency: str | None = None) -> tuple[bool, str]:
    async def run() -> tuple[bool, str]:
        client = aioredis.Redis.from_url(cfg.redis.redis_url)
        try:
            return await jobs.AsyncJobStore(client, cfg.redis, cfg.jobs).create(
                record, idempotency=idempotency
            )
        finally:
            await client.aclose()

    return asyncio.run(run())


def _cancel(cfg: Settings, job_id: str) -> str:
    async def run() -> str:
        client = aioredis.Redis.from_url(cfg.redis.redis_url)
        try:
            return await jobs.AsyncJobStore(client, cfg.redis, cfg.jobs).cancel(job_id)
        finally:
            await client.aclose()

    return asyncio.run(run())


def _load(client: redis.Redis, job_id: str) -> JobRecord:
    return JobRecord.decode(client.hgetall(KEYS.job(job_id)))


def _writer(client: redis.Redis, cfg: Settings, job_id: str) -> EventWriter:
    return EventWriter(
        client, KEYS, job_id, ttl_s=60, maxlen=1000, job=jobs.JobTracker(client, KEYS, job_id, job_ttl_s=120)
    )


def _scheduled(client: redis.Redis) -> list[bytes]:
    return client.zrange(KEYS.webhook_schedule, 0, -1)


@pytest.fixture(autouse=True)
def _clean_schedule(client: redis.Redis) -> None:
    client.delete(KEYS.webhook_schedule)


def test_create_stores_the_record_with_a_ttl(client: redis.Redis, cfg: Settings) -> None:
    job_id = uuid.uuid4().hex
    assert _create(cfg, _record(job_id)) == (True, job_id)
    rec = _load(client, job_id)
    assert rec.status == "queued" and rec.owner == "alice" and rec.mode == "rag"
    assert rec.delivery_status == "pending" and len(rec.delivery_id or "") == 32
    assert rec == _record(job_id).model_copy(
        update={
            "delivery_id": rec.delivery_id,
            "created_at": rec.created_at,
            "updated_at": rec.updated_at,
            "queued_at": rec.queued_at,
        }
    )
    assert 0 < client.ttl(KEYS.job(job_id)) <= 120


def test_same_idempotency_key_names_the_same_job(client: redis.Redis, cfg: Settings) -> None:
    digest = jobs.idempotency_digest("alice", f"key-{uuid.uuid4()}")
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    assert _create(cfg, _record(first), digest) == (True, first)
    assert _create(cfg, _record(second), digest) == (False, first)
    assert not client.exists(KEYS.job(second))
    assert jobs.idempotency_digest("bob", "k") != jobs.idempotency_digest("alice", "k")


def test_stages_only_move_forward(client: redis.Redis, cfg: Settings) -> None:
    job_id = uuid.uuid4().hex
    _create(cfg, _record(job_id))
    w = _writer(client, cfg, job_id)
    assert w.start("retrieving")
    w.emit(Sources(sources=[SOURCE]))
    assert _load(client, job_id).status == "generating"
    # a redelivered retrieval task does not move the job back
    assert w.start("retrieving")
    rec = _load(client, job_id)
    assert rec.status == "generating"
    assert rec.retrieving_at is not None and rec.generating_at is not None
    assert rec.retrieving_at <= rec.generating_at


def test_retrieval_mode_never_shows_generating(client: redis.Redis, cfg: Settings) -> None:
    job_id = uuid.uuid4().hex
    _create(cfg, _record(job_id, mode="retrieval", webhook=None))
    w = _writer(client, cfg, job_id)
    assert w.start("retrieving")
    w.emit(Sources(sources=[SOURCE]))
    w.emit(Done(answer=None, timings=Timings(retrieval_ms=3.0)))
    rec = _load(client, job_id)
    assert rec.status == "done" and rec.generating_at is None
    assert not _scheduled(client)  # no webhook_url, nothing to deliver
    body = JobView.of(rec).model_dump(mode="json")
    assert body["result"]["sources"] == [SOURCE.model_dump()]
    assert body["result"]["timings"]["total_ms"] > 0 and body["result"]["timings"]["retrieval_ms"] == 3.0
    assert body["webhook"] is None


def test_done_is_written_once_with_its_event_and_one_webhook(client: redis.Redis, cfg: Settings) -> None:
    job_id = uuid.uuid4().hex
    _create(cfg, _record(job_id))
    w = _writer(client, cfg, job_id)
    w.start("retrieving")
    w.emit(Sources(sources=[SOURCE]))
    w.emit(Token(text="Hi"))
    w.emit(Done(answer="Hi", usage=Usage(prompt_tokens=5, completion_tokens=1)))
    assert w.has_final()
    assert not w.start("generating")  # a redelivered generation task stops here
    # a duplicate task that got as far as finishing changes nothing
    w.emit(Done(answer="other"))
    rec = _load(client, job_id)
    assert isinstance(rec.result, Done) and rec.result.answer == "Hi"
    assert _scheduled(client) == [f"{job_id}:1".encode()]
    assert rec.delivery_status == "scheduled"
    types = [f[b"type"] for _id, f in client.xrange(KEYS.events(job_id))]
    assert types == [b"sources", b"token", b"done"]  # the late duplicate adds no second answer


def test_concurrent_finishers_win_exactly_once(client: redis.Redis, cfg: Settings) -> None:
    job_id = uuid.uuid4().hex
    _create(cfg, _record(job_id))
    tracker = jobs.JobTracker(client, KEYS, job_id, job_ttl_s=120)

    def finish(i: int) -> str:
        event = Done(answer=str(i)) if i % 2 else Error(status=500, message=str(i))
        return tracker.finish(KEYS.events(job_id), event, stream_ttl_s=60, maxlen=100)

    with cf.ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(finish, range(32)))
    assert outcomes.count("first") == 1 and outcomes.count("late") == 31
    assert len(_scheduled(client)) == 1


def test_cancel_beats_later_transitions(client: redis.Redis, cfg: Settings) -> None:
    job_id = uuid.uuid4().hex
    _create(cfg, _record(job_id))
    w = _writer(client, cfg, job_id)
    w.start("retrieving")
    w.emit(Sources(sources=[]))
    assert _cancel(cfg, job_id) == "first"
    assert _cancel(cfg, job_id) == "late"
    w.emit(Token(text="x"))
    w.emit(Done(answer="too late"))
    rec = _load(client, job_id)
    assert rec.status == "cancelled" and rec.result is None
    raw_error = client.hget(KEYS.job(job_id), "error")
    assert raw_error is not None and json.loads(raw_error) == {"status": 499, "message": "cancelled"}
    assert decode_event("error", raw_error) == Cancelled()
    assert not w.start("generating")
    assert _scheduled(client) == [f"{job_id}:1".encode()]  # the webhook reports the cancellation
    body = JobView.of(rec).model_dump(mode="json")
    assert body["status"] == "cancelled" and body["result"] is None
    assert set(body["timestamps"]) == {"queued", "retrieving", "generating", "cancelled"}


def test_error_event_fails_the_job(client: redis.Redis, cfg: Settings) -> None:
    job_id = uuid.uuid4().hex
    _create(cfg, _record(job_id, webhook=None))
    w = _writer(client, cfg, job_id)
    w.start("retrieving")
    w.emit(Error(status=404, message="unknown index 'x'"))
    body = JobView.of(_load(client, job_id)).model_dump(mode="json")
    assert body["status"] == "failed"
    assert body["error"] == {"status": 404, "message": "unknown index 'x'"}


def test_a_missing_job_stops_its_task(client: redis.Redis, cfg: Settings) -> None:
    w = _writer(client, cfg, uuid.uuid4().hex)
    assert not w.start("retrieving")


def test_plain_requests_have_no_tracker(cfg: Settings, client: redis.Redis) -> None:
    keys = Keys(cfg.redis.key_prefix)
    assert jobs.tracker(client, keys, cfg.jobs, None) is None
    assert isinstance(jobs.tracker(client, keys, cfg.jobs, "abc"), jobs.JobTracker)


def test_a_key_keeps_at_most_its_budget_of_finished_records(client: redis.Redis, cfg: Settings) -> None:
    """Past job_records_per_key a new job removes its key's oldest finished records, never one
    that is running or still has a webhook to deliver, nor another key's."""
    owner = f"key-{uuid.uuid4().hex[:8]}"
    budget = cfg.replace(job_records_per_key=3)

    def make(*, finish: bool, webhook: str | None = None, who: str = owner) -> str:
        job_id = uuid.uuid4().hex
        assert _create(
            budget, _record(job_id, mode="retrieval", webhook=webhook).model_copy(update={"owner": who})
        )[0]
        if finish:
            w = _writer(client, budget, job_id)
            w.start("retrieving")
            w.emit(Done(answer=None))
        time.sleep(0.002)  # creation order, to the millisecond
        return job_id

    running = make(finish=False)
    pending_hook = make(finish=True, webhook="https://hooks.example.com/x")  # scheduled, not delivered
    finished = [make(finish=True) for _ in range(3)]
    other_key = make(finish=True, who=f"other-{owner}")
    newest = make(finish=True)
    exists = {
        j: bool(client.exists(KEYS.job(j))) for j in [running, pending_hook, *finished, other_key, newest]
    }
    # Three finished and removable, then one more: the oldest finished ones went first, down to the
    # budget where the rest are not removable.
    assert exists == {
        running: True,
        pending_hook: True,
        finished[0]: False,
        finished[1]: False,
        finished[2]: False,
        other_key: True,
        newest: True,
    }
    assert client.zcard(KEYS.jobs_of(owner)) == 3
    assert 0 < client.ttl(KEYS.jobs_of(owner)) <= budget.jobs.job_ttl_s


def _record_bytes(client: redis.Redis, job_id: str) -> int:
    return sum(len(k) + len(v) for k, v in client.hgetall(KEYS.job(job_id)).items())


def test_a_key_keeps_at_most_its_bytes_of_finished_records(client: redis.Redis, cfg: Settings) -> None:
    """Past job_record_bytes_per_key a new job removes its key's oldest finished records (the
    count budget far away), never one running or with a webhook still to deliver."""
    owner = f"key-{uuid.uuid4().hex[:8]}"
    answer = "x" * 20_000  # a large answer: the record is ~20 KB
    budget = cfg.replace(job_records_per_key=1000, job_record_bytes_per_key=70_000)

    def make(*, finish: bool, webhook: str | None = None) -> str:
        job_id = uuid.uuid4().hex
        assert _create(budget, _record(job_id, webhook=webhook).model_copy(update={"owner": owner}))[0]
        if finish:
            w = _writer(client, budget, job_id)
            w.start("retrieving")
            w.emit(Done(answer=answer))
        time.sleep(0.002)  # creation order, to the millisecond
        return job_id

    running = make(finish=False)
    pending_hook = make(finish=True, webhook="https://hooks.example.com/x")  # scheduled, not delivered
    finished = [make(finish=True) for _ in range(5)]
    make(finish=False)  # the create that finds the key over its bytes
    kept = [j for j in [running, pending_hook, *finished] if client.exists(KEYS.job(j))]
    # The pending webhook's record counts (it cannot go yet), so two finished ones fit beside it.
    assert kept == [running, pending_hook, finished[3], finished[4]]
    sizes = {k.decode(): int(v) for k, v in client.hgetall(KEYS.job_bytes_of(owner)).items()}
    counted = {j: _record_bytes(client, j) for j in (pending_hook, finished[3], finished[4])}
    # Each record as it was when it finished (the webhook's record has changed little since).
    assert sizes.pop("total") == sum(sizes.values()) <= budget.jobs.job_record_bytes_per_key
    assert sizes.keys() == counted.keys()
    assert all(abs(sizes[j] - counted[j]) < 200 for j in counted)
    assert 0 < client.ttl(KEYS.job_bytes_of(owner)) <= budget.jobs.job_ttl_s


def test_a_finished_job_stream_lives_the_done_ttl_with_its_owner(client: redis.Redis, cfg: Settings) -> None:
    job_id = uuid.uuid4().hex
    assert _create(cfg, _record(job_id, mode="retrieval", webhook=None))[0]
    client.set(KEYS.stream_owner(job_id), "alice", ex=600)
    tracker = jobs.JobTracker(client, KEYS, job_id, job_ttl_s=120)
    assert tracker.finish(KEYS.events(job_id), Done(answer=None), stream_ttl_s=15, maxlen=100) == "first"
    assert 0 < client.ttl(KEYS.events(job_id)) <= 15 and 0 < client.ttl(KEYS.stream_owner(job_id)) <= 15
    other = uuid.uuid4().hex
    assert _create(cfg, _record(other, mode="retrieval", webhook=None))[0]
    assert _cancel(cfg.replace(event_stream_done_ttl_s=7), other) == "first"  # the API's cancel
    assert 0 < client.ttl(KEYS.events(other)) <= 7


def test_a_key_past_its_unfinished_jobs_cap_is_refused_until_one_finishes(
    client: redis.Redis, cfg: Settings
) -> None:
    capped = cfg.replace(key_max_unfinished_jobs=2)
    client.delete(KEYS.open_jobs("alice"), KEYS.jobs_of("alice"))
    first, second, third = (uuid.uuid4().hex for _ in range(3))
    assert _create(capped, _record(first)) == (True, first)
    assert _create(capped, _record(second), "digest-2") == (True, second)
    with pytest.raises(CapReached) as refused:
        _create(capped, _record(third), "digest-3")
    assert (refused.value.kind, refused.value.cap) == (UNFINISHED_JOBS, 2)
    # Nothing of it was stored: no record, and its Idempotency-Key names nothing.
    assert not client.exists(KEYS.job(third)) and not client.exists(KEYS.idempotency("digest-3"))
    # A replay of a known key is still answered, at the cap.
    assert _create(capped, _record(uuid.uuid4().hex), "digest-2") == (False, second)
    # A job that finishes (here: cancelled) frees its slot; one whose record is gone does too.
    assert _cancel(capped, first) == "first"
    assert _create(capped, _record(third), "digest-3") == (True, third)
    client.delete(KEYS.job(second))
    fourth = uuid.uuid4().hex
    assert _create(capped, _record(fourth)) == (True, fourth)
    assert {m.decode() for m in client.zrange(KEYS.open_jobs("alice"), 0, -1)} == {third, fourth}
    # Other keys have caps of their own; 0 is no cap.
    other = _record(uuid.uuid4().hex).model_copy(update={"owner": "bob"})
    assert _create(capped, other)[0] is True
    assert _create(cfg.replace(key_max_unfinished_jobs=0), _record(uuid.uuid4().hex))[0] is True


# -- the request a job keeps, and its fingerprint --------------------------------------------------

# A value other than the default for every field of the request: a field added to JobRequest
# must say here how it can differ, and then counts in the fingerprint with nothing more to write.
CHANGED: dict[str, object] = {
    "query": "another question",
    "top_k": 4,
    "mode": "retrieval",
    "index": "other",
    "ef_search": 64,
    "nprobe": 8,
    "abort_on_disconnect": False,
    "allow_early_exit": False,
    "allow_degraded": False,
    "retrieval": "lexical",
    "filter": {"path": {"prefix": "cafe"}},
    "diversity": False,
    "history": [{"role": "user", "content": "And on Sundays?"}],
    "max_tokens": 16,
    "temperature": 0.5,
    "stop": ["\n\n"],
    "webhook_url": "https://hooks.example.com/other",
    "metadata": {"ticket": 8},
}
BASE = JobRequest(query="q", top_k=3, index="test")


def test_every_field_of_the_request_is_in_the_fingerprint() -> None:
    assert CHANGED.keys() == JobRequest.model_fields.keys()
    prints = {
        name: jobs.fingerprint(BASE.model_validate({**BASE.model_dump(), name: value}))
        for name, value in CHANGED.items()
    }
    assert jobs.fingerprint(BASE) not in prints.values()
    assert len(set(prints.values())) == len(CHANGED), "two different requests share a fingerprint"


def test_an_omitted_field_is_its_default_in_the_fingerprint() -> None:
    stated = JobRequest(
        query="q",
        top_k=3,
        index="test",
        mode="rag",
        temperature=None,
        history=[],
        diversity=True,
        metadata=None,
    )
    assert jobs.fingerprint(stated) == jobs.fingerprint(BASE)
    assert jobs.fingerprint(BASE).startswith(jobs.FINGERPRINT_VERSION)


def test_the_record_keeps_the_whole_request(client: redis.Redis, cfg: Settings) -> None:
    job_id = uuid.uuid4().hex
    request = BASE.model_validate({**BASE.model_dump(), **CHANGED, "index": "test", "top_k": 3})
    assert _create(cfg, jobs.new_record(job_id=job_id, owner="alice", request=request, now=time.time()))[0]
    rec = _load(client, job_id)
    kept = rec.request.model_dump()
    assert kept == request.model_dump(exclude={"webhook_url", "metadata"})
    assert (rec.webhook_url, rec.metadata) == (request.webhook_url, request.metadata)
    assert rec.fingerprint == jobs.fingerprint(request)
    assert JobView.of(rec).model_dump(mode="json")["request"] == json.loads(rec.request.model_dump_json())


def _previous_release_record(job_id: str) -> dict[str, str]:
    """A job record as the release before this one wrote it: four fields of the request, and a
    fingerprint of them (with the webhook URL and metadata)."""
    now = time.time()
    request = {"query": "q", "top_k": 3, "mode": "rag", "index": "test"}
    webhook, metadata = "https://hooks.example.com/x", {"ticket": 7}
    digest_of = {**request, "webhook_url": webhook, "metadata": metadata}
    return {
        "id": job_id,
        "owner": "alice",
        "status": "queued",
        "created_at": repr(now),
        "updated_at": repr(now),
        "queued_at": repr(now),
        "request": json.dumps(request, separators=(",", ":")),
        "mode": "rag",
        "fingerprint": hashlib.sha256(
            json.dumps(digest_of, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest(),
        "metadata": json.dumps(metadata, separators=(",", ":")),
        "webhook_url": webhook,
        "delivery_id": uuid.uuid4().hex,
        "delivery_status": "pending",
        "delivery_attempts": "0",
    }


def test_a_record_of_the_previous_release_reads_back_and_finishes(client: redis.Redis, cfg: Settings) -> None:
    """Records in a running deployment's Redis outlive an upgrade: read leniently (the request's
    other fields at their defaults), run to the end, shown and delivered; but their fingerprint
    covers four fields, so no new request can match it."""
    job_id = uuid.uuid4().hex
    client.hset(KEYS.job(job_id), mapping=_previous_release_record(job_id))
    w = _writer(client, cfg, job_id)
    assert w.start("retrieving")
    w.emit(Sources(sources=[SOURCE]))
    w.emit(Done(answer="Hi"))
    rec = _load(client, job_id)
    assert (
        rec.status == "done"
        and rec.kind == "query"
        and rec.request == JobQuery(query="q", top_k=3, index="test")
    )
    body = json.loads(JobView.of(rec, delivery=False).webhook_body())
    assert {k: body["request"][k] for k in ("query", "top_k", "mode", "index")} == {
        "query": "q",
        "top_k": 3,
        "mode": "rag",
        "index": "test",
    }
    assert body["result"]["answer"] == "Hi" and body["result"]["sources"] == [SOURCE.model_dump()]
    assert body["metadata"] == {"ticket": 7} and "webhook" not in body
    same = JobRequest(
        query="q", top_k=3, index="test", webhook_url="https://hooks.example.com/x", metadata={"ticket": 7}
    )
    assert rec.fingerprint and not rec.fingerprint.startswith(jobs.FINGERPRINT_VERSION)
    assert jobs.fingerprint(same) != rec.fingerprint
