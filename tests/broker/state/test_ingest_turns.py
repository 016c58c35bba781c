"""Fair turns on the ingest queue (ingest_turns.py and its Lua), on real Redis: keys take turns,
one job each; a running job holds a lease, and one whose lease ends goes back to the front of
its key's line; a job given back keeps its place; a withdrawn one is gone."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis
from ragline.broker.contract.messages import IngestTask, QueuedIngest
from ragline.broker.redis.keys import Keys
from ragline.broker.state import ingest_turns
from ragline.broker.state.ingest_turns import Turns


@pytest.fixture
def keys(redis_url: str) -> Iterator[Keys]:
    k = Keys(f"ragline-test-turns-{uuid.uuid4().hex[:8]}")
    yield k
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{k.prefix}:*"):
        client.delete(key)


def _queued(key: str, job_id: str) -> QueuedIngest:
    task = IngestTask(job_id=job_id, index="docs", operation="add", staging=job_id, enqueued_at=time.time())
    return QueuedIngest(key=key, task=task)


def _push(redis_url: str, keys: Keys, *queued: QueuedIngest, withdraw: QueuedIngest | None = None) -> None:
    async def push() -> None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            for q in queued:
                await ingest_turns.apush(client, keys, q)
            if withdraw is not None:
                await ingest_turns.awithdraw(client, keys, withdraw)
        finally:
            await client.aclose()

    asyncio.run(push())


def _drain(turns: Turns) -> list[str]:
    order = []
    while (taken := turns.take()) is not None:
        order.append(taken.job_id)
        turns.finish(taken)
    return order


def test_keys_take_turns_one_job_each_whatever_their_backlog(redis_url: str, keys: Keys) -> None:
    client = redis.Redis.from_url(redis_url)
    turns = Turns(client, keys, lease_s=60)
    _push(redis_url, keys, *[_queued("a", f"a{i}") for i in range(100)])
    first = turns.take()  # a's first job runs; b and c upload meanwhile
    assert first is not None and first.job_id == "a0" and first.queued.key == "a"
    _push(redis_url, keys, _queued("b", "b0"), _queued("c", "c0"), _queued("b", "b1"))
    turns.finish(first)
    order = _drain(turns)
    # b's upload waited for the job running when it came, not for a's 99 more.
    assert order[:5] == ["b0", "c0", "a1", "b1", "a2"]
    assert order[5:] == [f"a{i}" for i in range(3, 100)]
    assert turns.take() is None and turns.waiting() == 0
    for line in (keys.ingest_ring, keys.ingest_parked, keys.ingest_tasks, keys.ingest_running):
        assert not client.exists(line), line


def test_no_worker_idles_while_a_parked_key_has_jobs(redis_url: str, keys: Keys) -> None:
    """A second worker takes a's next job while its first runs, when no other key waits."""
    client = redis.Redis.from_url(redis_url)
    turns = Turns(client, keys, lease_s=60)
    _push(redis_url, keys, _queued("a", "a0"), _queued("a", "a1"), _queued("a", "a2"))
    running = [turns.take(), turns.take()]
    assert [t.job_id for t in running if t] == ["a0", "a1"]
    _push(redis_url, keys, _queued("b", "b0"))
    for taken in running:
        assert taken is not None
        turns.finish(taken)
    assert _drain(turns) == ["b0", "a2"]


def test_a_job_whose_lease_ended_goes_back_to_the_front_of_its_line(redis_url: str, keys: Keys) -> None:
    client = redis.Redis.from_url(redis_url)
    short = Turns(client, keys, lease_s=0.2)
    _push(redis_url, keys, _queued("a", "a0"), _queued("a", "a1"), _queued("b", "b0"))
    died = short.take()  # its worker dies: no renewal
    kept = short.take()
    assert died is not None and kept is not None and (died.job_id, kept.job_id) == ("a0", "b0")
    assert short.recover() == 0  # leases still held
    time.sleep(0.15)
    assert short.renew(kept)  # renewed, so it stays running
    time.sleep(0.1)
    assert short.recover() == 1
    assert not short.renew(died)  # its old worker's renewal finds no lease
    short.finish(kept)
    assert _drain(Turns(client, keys, lease_s=60)) == ["a0", "a1"]
    assert client.hlen(keys.ingest_tasks) == 0 and client.zcard(keys.ingest_running) == 0


def test_a_job_given_back_keeps_its_place_and_a_withdrawn_one_is_gone(redis_url: str, keys: Keys) -> None:
    client = redis.Redis.from_url(redis_url)
    turns = Turns(client, keys, lease_s=60)
    gone = _queued("c", "c0")
    _push(redis_url, keys, _queued("a", "a0"), _queued("a", "a1"), gone, withdraw=gone)
    taken = turns.take()
    assert taken is not None and taken.job_id == "a0"
    turns.give_back(taken)  # its index was locked
    assert turns.waiting() == 2 and client.zcard(keys.ingest_running) == 0
    assert _drain(turns) == ["a0", "a1"]
    assert client.llen(keys.ingest_ring) == 0 and client.exists(keys.ingest_waiting("c")) == 0
