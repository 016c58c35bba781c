"""Job records on a real Redis: idempotent create, forward-only stages, one final result."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import time
import uuid

import pytest
import redis
import redis.asyncio as aioredis

from broker import jobs
from broker.contract import Cancelled, Done, Error, Source, Sources, Timings, Token, Usage, decode_event
from broker.events import EventWriter
from broker.keys import Keys
from broker.leases import UNFINISHED_JOBS, CapReached
from broker.settings import Settings

PREFIX = "ragline-test-jobs"
KEYS = Keys(PREFIX)


@pytest.fixture
def cfg(redis_url: str) -> Settings:
    return Settings().replace(redis_url=redis_url, key_prefix=PREFIX, job_ttl_s=120, event_stream_ttl_s=60)


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


SOURCE = Source(chunk_id="c1", source="s.md", title="t", text="t", score=0.5)


def _record(job_id: str, *, mode: str = "rag", webhook: str | None = "https://hooks.example.com/x") -> dict:
    return jobs.new_record(
        job_id=job_id,
        owner="alice",
        request={"query": "q", "top_k": 3, "mode": mode, "index": "test"},
        webhook_url=webhook,
        metadata={"ticket": 7},
        now=time.time(),
    )


def _create(cfg: Settings, record: dict, idempotency: str | None = None) -> tuple[bool, str]:
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


def _load(client: redis.Redis, job_id: str) -> dict[str, str]:
    return jobs.decode(client.hgetall(KEYS.job(job_id)))


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
    assert rec["status"] == "queued" and rec["owner"] == "alice" and rec["mode"] == "rag"
    assert rec["delivery_status"] == "pending" and len(rec["delivery_id"]) == 32
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
    assert _load(client, job_id)["status"] == "generating"
    # a redelivered retrieval task does not move the job back
    assert w.start("retrieving")
    rec = _load(client, job_id)
    assert rec["status"] == "generating"
    assert float(rec["retrieving_at"]) <= float(rec["generating_at"])


def test_retrieval_mode_never_shows_generating(client: redis.Redis, cfg: Settings) -> None:
    job_id = uuid.uuid4().hex
    _create(cfg, _record(job_id, mode="retrieval", webhook=None))
    w = _writer(client, cfg, job_id)
    assert w.start("retrieving")
    w.emit(Sources(sources=[SOURCE]))
    w.emit(Done(answer=None, timings=Timings(retrieval_ms=3.0)))
    rec = _load(client, job_id)
    assert rec["status"] == "done" and "generating_at" not in rec
    assert not _scheduled(client)  # no webhook_url, nothing to deliver
    body = jobs.view(rec)
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
    assert json.loads(rec["result"])["answer"] == "Hi"
    assert _scheduled(client) == [f"{job_id}:1".encode()]
    assert rec["delivery_status"] == "scheduled"
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
    assert rec["status"] == "cancelled" and "result" not in rec
    assert json.loads(rec["error"]) == {"status": 499, "message": "cancelled"}
    assert decode_event("error", rec["error"]) == Cancelled()
    assert not w.start("generating")
    assert _scheduled(client) == [f"{job_id}:1".encode()]  # the webhook reports the cancellation
    body = jobs.view(rec)
    assert body["status"] == "cancelled" and body["result"] is None
    assert set(body["timestamps"]) == {"queued", "retrieving", "generating", "cancelled"}


def test_error_event_fails_the_job(client: redis.Redis, cfg: Settings) -> None:
    job_id = uuid.uuid4().hex
    _create(cfg, _record(job_id, webhook=None))
    w = _writer(client, cfg, job_id)
    w.start("retrieving")
    w.emit(Error(status=404, message="unknown index 'x'"))
    body = jobs.view(_load(client, job_id))
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
        assert _create(budget, {**_record(job_id, mode="retrieval", webhook=webhook), "owner": who})[0]
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
        assert _create(budget, {**_record(job_id, webhook=webhook), "owner": owner})[0]
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
    other = _record(uuid.uuid4().hex) | {"owner": "bob"}
    assert _create(capped, other)[0] is True
    assert _create(cfg.replace(key_max_unfinished_jobs=0), _record(uuid.uuid4().hex))[0] is True
