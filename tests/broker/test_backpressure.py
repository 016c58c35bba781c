"""The backpressure monitor on a real Redis, with real Celery messages laid out by kombu."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from dataclasses import replace

import pytest
import redis
import redis.asyncio as aioredis
from kombu import Connection, Consumer, Queue

from broker.backpressure import BackpressureMonitor, QueueLoad, count_done, priority_lists
from broker.celery_app import create_celery
from broker.keys import Keys
from broker.settings import Settings


def _monitor(redis_url: str, keys: Keys, queues: tuple[str, ...], **kw: float) -> BackpressureMonitor:
    client = aioredis.Redis.from_url(redis_url)
    return BackpressureMonitor(
        client,
        keys,
        queues,
        refresh_s=kw.get("refresh_s", 0.001),
        tau_s=kw.get("tau_s", 1.0),
        heartbeat_ttl_s=6,
    )


def test_priority_lists_are_kombus() -> None:
    assert priority_lists("retrieval") == [
        "retrieval",
        "retrieval\x06\x163",
        "retrieval\x06\x166",
        "retrieval\x06\x169",
    ]


def test_depth_counts_every_priority_list_and_the_unacked_hash(redis_url: str) -> None:
    queue = f"bp-{uuid.uuid4().hex[:8]}"
    keys = Keys(f"ragline-test-{uuid.uuid4().hex[:8]}")
    app = create_celery(Settings(redis_url=redis_url))
    for priority in (0, 0, 0, 4, 9, 9):
        app.send_task("ragline.nothing", kwargs={"x": priority}, queue=queue, priority=priority)
    sync = redis.Redis.from_url(redis_url)
    assert sum(sync.llen(k) for k in priority_lists(queue)) == 6
    assert sync.llen(queue) == 3  # a monitor reading only the plain list would miss half

    # A consumer with prefetch 2 takes two messages and holds them unacknowledged, as a worker does.
    with Connection(redis_url) as conn:
        held = []
        channel = conn.channel()
        with Consumer(channel, [Queue(queue)], callbacks=[lambda _b, m: held.append(m)], accept=["json"]):
            channel.basic_qos(0, 2, False)
            deadline = time.monotonic() + 5
            while len(held) < 2 and time.monotonic() < deadline:
                conn.drain_events(timeout=1)
        assert len(held) == 2

        async def measure() -> QueueLoad:
            monitor = _monitor(redis_url, keys, (queue, "other-queue"))
            snapshot = await monitor.refresh()
            assert snapshot.load("other-queue").depth == 0
            return snapshot.load(queue)

        load = asyncio.run(measure())
        assert (load.waiting, load.in_flight, load.depth) == (4, 2, 6)
        for message in held:
            message.ack()
    for k in priority_lists(queue):
        sync.delete(k)


def _set_counters(sync: redis.Redis, keys: Keys, queue: str, requests: int, tasks: int) -> None:
    sync.hset(keys.done(queue), mapping={"requests": requests, "tasks": tasks})


def test_service_rate_is_an_ewma_of_completions_while_busy(redis_url: str) -> None:
    queue = f"bp-{uuid.uuid4().hex[:8]}"
    keys = Keys(f"ragline-test-{uuid.uuid4().hex[:8]}")
    sync = redis.Redis.from_url(redis_url)
    tau = 1.0
    alpha = 1 - math.exp(-1.0 / tau)  # refreshes 1 s apart

    async def scenario() -> list[QueueLoad]:
        monitor = _monitor(redis_url, keys, (queue,), tau_s=tau)
        seen = []
        t = 1_000_000

        async def at(ms: int) -> QueueLoad:
            await asyncio.sleep(0.005)  # past the 1 ms lease
            return (await monitor.refresh(now_ms=ms)).load(queue)

        seen.append(await at(t))  # cold: nothing known
        sync.rpush(queue, "a", "b", "c", "d")  # work waits
        seen.append(await at(t + 1000))  # busy from here on, no completion yet
        # 2 batches of 10 requests each finished in the next second
        pipe = sync.pipeline()
        count_done(pipe, keys, queue, 10)
        count_done(pipe, keys, queue, 10)
        pipe.execute()
        seen.append(await at(t + 2000))
        sync.delete(queue)
        seen.append(await at(t + 3000))  # the queue emptied (busy at the start of the interval)
        seen.append(await at(t + 4000))  # idle: the rate stays as it was
        seen.append(await at(t + 5000))
        sync.rpush(queue, "e")
        seen.append(await at(t + 6000))
        seen.append(await at(t + 7000))  # busy, no completion: the rate decays (a stall shows)
        sync.delete(queue)
        return seen

    cold, waiting, first, emptied, idle1, idle2, _, stalled = asyncio.run(scenario())
    assert not cold.known and cold.predicted_wait_s() == 0.0
    assert waiting.depth == 4 and not waiting.known
    assert waiting.predicted_wait_s() == 0.0  # rate unknown: admit (the depth limits guard)
    assert first.known
    assert first.rate == pytest.approx(alpha * 20, rel=1e-3)
    assert first.task_rate == pytest.approx(alpha * 2, rel=1e-3)
    # the 4 tasks ahead, then its own
    assert first.predicted_wait_s() == pytest.approx(5 / first.task_rate, rel=1e-3)
    assert first.predicted_wait_s(extra_requests=3) == pytest.approx(
        5 / first.task_rate + 3 / first.rate, rel=1e-3
    )
    assert emptied.rate == pytest.approx(first.rate * (1 - alpha), rel=1e-3)
    assert idle1.rate == pytest.approx(emptied.rate, rel=1e-6)
    assert idle2.rate == pytest.approx(emptied.rate, rel=1e-6)
    # idle: only its own service time is left
    assert idle2.depth == 0 and idle2.predicted_wait_s() == pytest.approx(1 / idle2.task_rate, rel=1e-3)
    assert stalled.rate == pytest.approx(emptied.rate * (1 - alpha), rel=1e-3)


def test_service_time_follows_the_quickest_tasks_and_bounds_the_prediction(redis_url: str) -> None:
    queue = f"bp-{uuid.uuid4().hex[:8]}"
    keys = Keys(f"ragline-test-{uuid.uuid4().hex[:8]}")
    sync = redis.Redis.from_url(redis_url)

    async def scenario() -> list[QueueLoad]:
        monitor = _monitor(redis_url, keys, (queue,), tau_s=1.0)
        seen = []
        steps = ((1_000_000, []), (1_001_000, [2.0]), (1_002_000, [4.0, 4.0]), (1_003_000, [1.0]))
        for ms, tasks in steps:
            pipe = sync.pipeline()
            for seconds in tasks:
                count_done(pipe, keys, queue, 1, seconds)
            pipe.execute()
            await asyncio.sleep(0.005)  # past the 1 ms lease
            seen.append((await monitor.refresh(now_ms=ms)).load(queue))
        return seen

    _, first, slower, quicker = asyncio.run(scenario())
    assert first.service_s == pytest.approx(2.0, rel=1e-3)  # the first completion sets it
    assert slower.service_s == pytest.approx(2.0 + (1 - 0.98**2) * 2.0, rel=1e-3)  # slowly up
    assert quicker.service_s == pytest.approx(1.0, rel=1e-3)  # at once down
    # A batching worker finishes tasks faster than it serves any one: never predict less than one.
    fast = QueueLoad("q", in_flight=1, rate=2.0, task_rate=2.0, known=True, service_s=3.0)
    assert fast.predicted_wait_s() == pytest.approx(3.0)
    assert replace(fast, service_s=0.5).predicted_wait_s() == pytest.approx(1.0)  # (1 + 1) / 2


def test_stalled_queue_predicts_an_infinite_wait() -> None:
    load = QueueLoad("q", waiting=3, in_flight=1, rate=0.0, task_rate=0.0, known=True)
    assert math.isinf(load.predicted_wait_s())
    assert QueueLoad("q", known=True).predicted_wait_s() == 0.0


def test_one_refresh_per_lease_across_processes(redis_url: str) -> None:
    """Two monitors (two API processes) share one snapshot; only one measures per lease."""
    queue = f"bp-{uuid.uuid4().hex[:8]}"
    keys = Keys(f"ragline-test-{uuid.uuid4().hex[:8]}")
    sync = redis.Redis.from_url(redis_url)

    async def scenario() -> tuple[int, int, int, int]:
        a = _monitor(redis_url, keys, (queue,), refresh_s=0.5)
        b = _monitor(redis_url, keys, (queue,), refresh_s=0.5)
        await a.refresh()
        sync.rpush(queue, "x", "y")
        seen_by_b = (await b.refresh()).load(queue).depth  # inside a's lease: a's snapshot
        await asyncio.sleep(0.55)
        fresh = (await b.refresh()).load(queue).depth
        return a.refreshed, b.refreshed, seen_by_b, fresh

    a_won, b_won, seen_by_b, fresh = asyncio.run(scenario())
    sync.delete(queue)
    assert (a_won, b_won) == (1, 1)
    assert seen_by_b == 0 and fresh == 2
