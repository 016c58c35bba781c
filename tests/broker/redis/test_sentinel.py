"""On a real Sentinel set (one primary, two replicas, three sentinels: ``ragline.ha``'s, as
``ragline up --ha`` runs them): clients follow a failover without an error, Lua scripts load
again on the new primary (NOSCRIPT), a job no replica acknowledges is refused and undone, and a
callbacks worker and an API process keep serving through the primary's SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from ragline.broker.config.settings import RedisSettings, Settings
from ragline.broker.contract.messages import Done
from ragline.broker.contract.records import JobRecord
from ragline.broker.limits.ratelimit import AuthRateLimiter, Limits, Status
from ragline.broker.redis.durability import NotReplicated, Replication
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.pool import async_client, sync_client
from ragline.broker.state import jobs

from tests.helpers import finished_job_record, start_api, wait_for_workers, worker
from tests.sentinel_set import SentinelSet, sentinel_set
from tests.webhook_receiver import running_receiver

pytestmark = [pytest.mark.redis, pytest.mark.slow]
KEYS = Keys("ragline-test-sentinel")


@pytest.fixture(scope="module")
def the_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSet]:
    with sentinel_set(tmp_path_factory.mktemp("sentinel-set")) as started:
        yield started


def test_sync_and_async_clients_follow_the_primarys_sigkill(the_set: SentinelSet) -> None:
    settings = RedisSettings(redis_url=the_set.url(5))
    client = sync_client(settings)
    key = f"counter-{uuid.uuid4().hex}"
    client.set(key, 0)
    the_set.primary().wait(2, 1000)  # on both replicas before the primary dies

    async def count(n: int) -> int:
        aclient = async_client(settings)
        try:
            for _ in range(n):
                await aclient.incr(key)
            return int(await aclient.get(key) or 0)
        finally:
            await aclient.aclose()

    old = the_set.primary_port()
    the_set.kill(old)
    killed = time.monotonic()
    done, errors, last_error_at = 0, [], 0.0
    while time.monotonic() - killed < 12:  # through the switch and after it
        try:
            client.incr(key)
            done += 1
        except redis.RedisError as exc:
            errors.append(exc)
            last_error_at = time.monotonic() - killed
        time.sleep(0.01)
    new = the_set.wait_new_primary(old)
    # A call waits for the new primary as long as its own timeout allows (a socket timeout's worth
    # of backoff), and fails with a connection error past it: the API answers that with a 503.
    assert all(isinstance(e, redis.ConnectionError) for e in errors), errors
    assert last_error_at < 10 and done > 100
    assert asyncio.run(count(50)) >= done + 50
    assert int(redis.Redis(port=new, db=5).get(key) or 0) >= done + 50  # the writes are on the new one
    the_set.revive()


def test_scripts_load_again_after_a_script_flush_and_on_a_new_primary(the_set: SentinelSet) -> None:
    settings = RedisSettings(redis_url=the_set.url(5))

    async def take() -> bool:
        aclient = async_client(settings)
        try:
            limiter = AuthRateLimiter(
                aclient, KEYS, Limits(100, 100, 1000, 1000), auth=False, rate_limit=True
            )
            return (await limiter.check(None)).status == Status.ALLOWED
        finally:
            await aclient.aclose()

    assert asyncio.run(take())
    the_set.primary().script_flush()  # NOSCRIPT next: the script is loaded again
    assert asyncio.run(take())
    the_set.kill_primary()  # the new primary has none of them cached: NOSCRIPT, loaded again
    assert asyncio.run(take())
    tracker = jobs.JobTracker(sync_client(settings), KEYS, uuid.uuid4().hex, job_ttl_s=60)
    the_set.primary().script_flush()
    assert tracker.start("retrieving") is False  # a sync StateScript: ran (no such job), no NOSCRIPT
    the_set.revive()


def _stopped(the_set: SentinelSet) -> list[int]:
    replicas = [p for p in the_set.ports.data if p != the_set.primary_port()]
    for port in replicas:
        os.kill(the_set.procs[f"redis-{port}"].pid, signal.SIGSTOP)
    return replicas


def _resumed(the_set: SentinelSet, replicas: list[int]) -> None:
    for port in replicas:
        os.kill(the_set.procs[f"redis-{port}"].pid, signal.SIGCONT)
    the_set.wait_ready()


def test_a_job_no_replica_acknowledges_is_refused_and_undone(the_set: SentinelSet) -> None:
    settings = Settings().replace(redis_url=the_set.url(6), key_prefix=KEYS.prefix, redis_wait_ms=300)
    assert Replication.of(settings.redis) == Replication(1, 300)  # on with a Sentinel URL

    async def submit(job_id: str, idempotency: str) -> None:
        aclient = async_client(settings.redis)
        try:
            store = jobs.AsyncJobStore(aclient, settings.redis, settings.jobs)
            record = finished_job_record("http://127.0.0.1:9/x") | {"id": job_id, "status": "queued"}
            created, _ = await store.create(JobRecord.decode(record), idempotency=idempotency)
            assert created
            await store.confirm(job_id, idempotency=idempotency)
        finally:
            await aclient.aclose()

    accepted = uuid.uuid4().hex
    asyncio.run(submit(accepted, f"idem-{accepted}"))  # replicas answer: accepted
    replicas = _stopped(the_set)
    try:
        refused = uuid.uuid4().hex
        started = time.monotonic()
        with pytest.raises(NotReplicated, match="0 of 1"):
            asyncio.run(submit(refused, f"idem-{refused}"))
        assert time.monotonic() - started < 3  # bounded by redis_wait_ms, not a socket timeout
        data = redis.Redis(port=the_set.primary_port(), db=6)
        assert data.exists(KEYS.job(refused), KEYS.idempotency(f"idem-{refused}")) == 0  # nothing half-made
        assert data.exists(KEYS.job(accepted)) == 1
    finally:
        _resumed(the_set, replicas)


def test_a_final_state_is_confirmed_on_a_replica(the_set: SentinelSet) -> None:
    settings = RedisSettings(redis_url=the_set.url(6), key_prefix=KEYS.prefix)
    client = sync_client(settings)
    job_id = uuid.uuid4().hex
    client.hset(
        KEYS.job(job_id), mapping=finished_job_record("http://127.0.0.1:9/x") | {"status": "generating"}
    )
    tracker = jobs.JobTracker(client, KEYS, job_id, job_ttl_s=60, replication=Replication.of(settings))
    done = Done(answer="a")
    assert tracker.finish(KEYS.events(job_id), done, stream_ttl_s=60, maxlen=100) == "first"
    primary = the_set.primary_port()
    replicas = [p for p in the_set.ports.data if p != primary]
    # Once finish returns: on the primary and (WAIT 1) on at least one replica, at once.
    statuses = [redis.Redis(port=p, db=6).hget(KEYS.job(job_id), "status") for p in [primary, *replicas]]
    assert statuses[0] == b"done" and b"done" in statuses[1:], statuses


@pytest.mark.stack  # a callbacks worker and an API process
def test_a_worker_and_an_api_follow_the_primarys_sigkill(the_set: SentinelSet, tmp_path: Path) -> None:
    settings = Settings().replace(
        redis_url=the_set.url(7),
        home=tmp_path,
        dev_mode=True,
        auth_enabled=False,
        worker_heartbeat_s=0.5,
        worker_heartbeat_ttl_s=2.0,
        webhook_host_allowlist=["127.0.0.1"],
        webhook_poll_interval_s=0.1,
        webhook_backoff_base_s=0.2,
        webhook_backoff_max_s=1.0,
    )
    callbacks = worker("callbacks", settings, tmp_path / "callbacks.log")
    callbacks.start()
    api = None
    try:
        wait_for_workers(settings, ("callbacks",), [callbacks], timeout=120)
        api = start_api(settings, tmp_path / "api.log")
        keys = Keys(settings.redis.key_prefix)
        with running_receiver() as receiver:

            def deliver() -> str:
                url = receiver.url()
                record = finished_job_record(url)
                client = sync_client(settings.redis)
                client.hset(keys.job(record["id"]), mapping=record)
                client.zadd(keys.webhook_schedule, {f"{record['id']}:1": time.time()})
                return url

            before = deliver()
            receiver.wait(before, 1, timeout=30)
            old = the_set.primary_port()
            the_set.kill(old)
            statuses: list[int] = []
            killed = time.monotonic()
            first_ok = None
            with httpx.Client(base_url=api.base, timeout=10) as http:
                while time.monotonic() - killed < 40:
                    status = http.get(f"/v1/jobs/{uuid.uuid4().hex}").status_code
                    statuses.append(status)
                    if status == 404 and first_ok is None and the_set.primary_port() != old:
                        first_ok = time.monotonic() - killed
                        break
                    time.sleep(0.1)
            assert first_ok is not None, f"the API did not answer again: {statuses[-5:]}"
            assert set(statuses) <= {404, 503}, statuses  # never a 500
            after = deliver()  # queued through kombu's sentinel transport, to the new primary
            (hook,) = receiver.wait(after, 1, timeout=30)
            assert hook.headers["x-ragline-attempt"] == "1"
            time.sleep(1)
            assert len(receiver.received(before)) == 1 and len(receiver.received(after)) == 1
            new = redis.Redis(port=the_set.primary_port(), db=7)
            beats = new.zrangebyscore(keys.workers("callbacks"), time.time() - 2.0, "+inf")
            assert beats, "the worker's heartbeat did not reach the new primary"
    finally:
        if api is not None:
            api.proc.stop()
        callbacks.stop()
        the_set.revive()  # the old primary back, as a replica of the new one
