"""The backpressure monitor on a real Redis, with real Celery messages laid out by kombu."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import uuid
from dataclasses import replace

import pytest
import redis
import redis.asyncio as aioredis
from kombu import Connection, Consumer, Queue

from broker.backpressure import (
    BackpressureMonitor,
    Occupancy,
    QueueLoad,
    ServiceTimes,
    count_done,
    priority_lists,
)
from broker.celery_app import create_celery
from broker.keys import Keys
from broker.settings import RedisSettings


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
    app = create_celery(RedisSettings(redis_url=redis_url))
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


def _counted(sync: redis.Redis, keys: Keys, queue: str, *tasks: tuple[float, float], slots: int = 1) -> None:
    """Finished tasks of (seconds, concurrency), as a worker reports them."""
    pipe = sync.pipeline()
    for seconds, concurrency in tasks:
        count_done(pipe, keys, queue, 1, seconds, concurrency=concurrency, slots=slots)
    pipe.execute()


async def _at(monitor: BackpressureMonitor, queue: str, ms: int) -> QueueLoad:
    await asyncio.sleep(0.002)  # past the 1 ms lease
    return (await monitor.refresh(now_ms=ms)).load(queue)


def test_finished_tasks_fold_into_service_times_weighted_by_recency(redis_url: str) -> None:
    queue = f"bp-{uuid.uuid4().hex[:8]}"
    keys = Keys(f"ragline-test-{uuid.uuid4().hex[:8]}")
    sync = redis.Redis.from_url(redis_url)

    async def scenario() -> list[QueueLoad]:
        monitor = _monitor(redis_url, keys, (queue,))
        seen = [await _at(monitor, queue, 1_000_000)]  # cold: nothing known
        _counted(sync, keys, queue, (2.0, 1.0), (4.0, 3.0), slots=8)
        seen.append(await _at(monitor, queue, 1_001_000))
        _counted(sync, keys, queue, (6.0, 5.0), slots=8)
        seen.append(await _at(monitor, queue, 1_002_000))
        seen.append(await _at(monitor, queue, 1_900_000))  # a long gap: still what the tasks took
        return seen

    cold, first, second, later = asyncio.run(scenario())
    assert not cold.known and cold.predicted_wait_s() == 0.0
    assert first.known and first.slots == 8
    assert (first.service.n, first.service.c, first.service.s) == pytest.approx((2, 4, 6))
    assert (first.service.cc, first.service.cs) == pytest.approx((10, 14))
    keep = 0.98  # each earlier task weighs a fiftieth less per later one
    assert second.service.n == pytest.approx(2 * keep + 1)
    assert second.service.s == pytest.approx(6 * keep + 6)
    assert second.service.cs == pytest.approx(14 * keep + 30)
    assert later.service == second.service
    # Through (1, 2 s), (3, 4 s), (5, 6 s): one second more per task in the batch.
    assert second.service.at(1) == pytest.approx(2.0, rel=1e-2)
    assert second.service.at(8) == pytest.approx(9.0, rel=1e-2)


def test_service_time_against_concurrency() -> None:
    # Spread enough to see a slope: the least-squares line (here exact).
    line = ServiceTimes.of((2.0, 1.0), (4.0, 3.0), (6.0, 5.0))
    assert line.at(2) == pytest.approx(3.0) and line.at(7) == pytest.approx(8.0)
    # Company never makes a task quicker: a falling line is taken flat, at the mean.
    falling = ServiceTimes.of((6.0, 1.0), (2.0, 3.0))
    assert falling.at(1) == pytest.approx(4.0) and falling.at(8) == pytest.approx(4.0)
    # Nor slower than in proportion (the engine's throughput fixed).
    steep = ServiceTimes.of((1.0, 1.0), (9.0, 3.0))
    assert steep.at(4) == pytest.approx(5.0 * 4 / 2)
    # All at one concurrency: flat above it, proportional below it (both err towards admitting).
    lone = ServiceTimes.of((14.0, 1.0), (13.0, 1.1), (15.0, 1.0))
    assert lone.at(1) == pytest.approx(14.0 / lone.c * 3, rel=1e-6)
    assert lone.at(8) == pytest.approx(14.0)
    full = ServiceTimes.of((20.0, 8.0), (22.0, 8.0))
    assert full.at(8) == pytest.approx(21.0) and full.at(1) == pytest.approx(21.0 / 8)
    assert ServiceTimes().at(3) == 0.0


def test_predicted_wait_is_its_own_time_in_a_free_slot_else_the_tasks_ahead_of_it_too() -> None:
    service = ServiceTimes.of((2.0, 1.0), (4.0, 3.0), (6.0, 5.0))  # 1 s + 1 s per task at once
    load = QueueLoad("q", known=True, live_workers=1, slots=4, service=service)
    assert load.predicted_wait_s() == pytest.approx(2.0)  # alone
    assert replace(load, in_flight=2).predicted_wait_s() == pytest.approx(4.0)  # the third at once
    assert replace(load, in_flight=3).predicted_wait_s() == pytest.approx(5.0)  # the last slot
    # All 4 slots held and 3 waiting: it starts once 4 have finished, one every 5 s / 4.
    assert replace(load, in_flight=4, waiting=3).predicted_wait_s() == pytest.approx(4 * 5 / 4 + 5)
    # Requests admitted but not on the queue yet count as tasks, at the requests per task.
    assert replace(load, in_flight=2).predicted_wait_s(extra_requests=1) == pytest.approx(5.0)
    batches = replace(load, slots=1, service=ServiceTimes.of((0.1, 1.0), requests_per_task=10))
    assert batches.predicted_wait_s(extra_requests=5) == pytest.approx(0.15)  # half a batch ahead
    assert replace(batches, in_flight=1).predicted_wait_s() == pytest.approx(0.2)
    # Two workers share the depth.
    two = replace(load, live_workers=2, in_flight=4)
    assert two.predicted_wait_s() == pytest.approx(service.at(2.5))


def test_a_queue_busy_without_a_completion_for_long_is_stalled(redis_url: str) -> None:
    queue = f"bp-{uuid.uuid4().hex[:8]}"
    keys = Keys(f"ragline-test-{uuid.uuid4().hex[:8]}")
    sync = redis.Redis.from_url(redis_url)

    async def scenario() -> list[QueueLoad]:
        monitor = _monitor(redis_url, keys, (queue,), tau_s=1.0)
        t = 1_000_000
        await _at(monitor, queue, t)
        _counted(sync, keys, queue, (2.0, 1.0))
        seen = [await _at(monitor, queue, t + 1000)]
        sync.rpush(queue, "a")  # work waits, and nothing finishes
        for k in range(2, 12):
            seen.append(await _at(monitor, queue, t + k * 1000))
        _counted(sync, keys, queue, (2.0, 1.0))
        seen.append(await _at(monitor, queue, t + 12_000))
        sync.delete(queue)
        return seen

    served, *waited, finished = asyncio.run(scenario())
    assert served.rate > 0 and served.busy_s == 0
    assert [w.busy_s for w in waited] == pytest.approx([0, *range(1, 10)])
    # Waiting work without a completion pulls the rate down (the gauge); idle time did not.
    assert waited[-1].rate < waited[0].rate
    # Stalled past max(STALL_MIN_S, STALL_FACTOR * 2 s): 8 s here.
    assert [math.isinf(w.predicted_wait_s()) for w in waited] == [False] * 9 + [True]
    assert finished.busy_s == 0 and not math.isinf(finished.predicted_wait_s())


def test_a_worker_that_comes_up_starts_the_stall_afresh(redis_url: str) -> None:
    """What waited through an outage (no worker, or a dead one's tasks handed back) is no stall
    of the worker that comes up: its queue predicts a finite wait again at once."""
    queue = f"bp-{uuid.uuid4().hex[:8]}"
    keys = Keys(f"ragline-test-{uuid.uuid4().hex[:8]}")
    sync = redis.Redis.from_url(redis_url)

    async def scenario() -> list[QueueLoad]:
        monitor = _monitor(redis_url, keys, (queue,), tau_s=1.0)
        t = 1_000_000
        await _at(monitor, queue, t)
        _counted(sync, keys, queue, (2.0, 1.0))
        await _at(monitor, queue, t + 1000)
        sync.rpush(queue, "a")
        for k in range(2, 30):
            outage = await _at(monitor, queue, t + k * 1000)
        sync.zadd(keys.workers(queue), {"restarted@host": (t + 30_000) / 1000})
        came_up = await _at(monitor, queue, t + 30_000)
        still = await _at(monitor, queue, t + 31_000)
        sync.delete(queue)
        return [outage, came_up, still]

    outage, came_up, still = asyncio.run(scenario())
    assert math.isinf(outage.predicted_wait_s())
    assert came_up.live_workers == 1 and came_up.busy_s == 0 and not math.isinf(came_up.predicted_wait_s())
    assert still.busy_s == pytest.approx(1.0)  # and it counts again from there


def test_a_task_held_with_nothing_waiting_is_no_stall(redis_url: str) -> None:
    """A task kombu still lists as unacknowledged, with nothing waiting behind it (its ack was lost
    when Redis restarted; the visibility timeout hands it back minutes later), blocks no new
    request. Counted as a stall, it refused every request, so nothing finished and it never ended."""
    queue = f"bp-{uuid.uuid4().hex[:8]}"
    keys = Keys(f"ragline-test-{uuid.uuid4().hex[:8]}")
    sync = redis.Redis.from_url(redis_url)

    async def scenario() -> list[QueueLoad]:
        monitor = _monitor(redis_url, keys, (queue,), tau_s=1.0)
        t = 1_000_000
        await _at(monitor, queue, t)
        _counted(sync, keys, queue, (0.05, 1.0))
        await _at(monitor, queue, t + 1000)
        tags = _plant_in_flight(sync, queue, 1)
        try:
            return [await _at(monitor, queue, t + k * 1000) for k in range(2, 60)]
        finally:
            sync.hdel("unacked", *tags)

    held = asyncio.run(scenario())
    assert all(load.in_flight == 1 and load.busy_s == 0 for load in held)
    assert not any(math.isinf(load.predicted_wait_s()) for load in held)


def test_stalled_queue_predicts_an_infinite_wait() -> None:
    service = ServiceTimes.of((1.0, 1.0))
    load = QueueLoad("q", waiting=3, in_flight=1, known=True, service=service, busy_s=60.0)
    assert math.isinf(load.predicted_wait_s())
    assert QueueLoad("q", known=True, service=service, busy_s=60.0).predicted_wait_s() == 1.0  # idle


def test_occupancy_is_the_mean_number_of_tasks_running_during_each(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr("broker.backpressure.time.monotonic", lambda: clock[0])
    occupancy = Occupancy(slots=8)
    means: dict[str, float] = {}
    started = threading.Barrier(2)

    def long_task() -> None:  # alone for 2 s, then with the short one for 2 s, then alone 4 s
        occupancy.enter()
        started.wait()
        done.wait()
        means["long"] = occupancy.mean()
        occupancy.leave()

    done = threading.Event()
    thread = threading.Thread(target=long_task)
    thread.start()
    started.wait()
    clock[0] += 2
    occupancy.enter()  # the short task, in this thread
    clock[0] += 2
    means["short"] = occupancy.mean()
    occupancy.leave()
    clock[0] += 4
    done.set()
    thread.join()
    assert means == pytest.approx({"short": 2.0, "long": (2 + 4 + 4) / 8})
    assert occupancy.mean() == 1.0  # outside a task
    assert occupancy.slots == 8


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


def _plant_in_flight(sync: redis.Redis, queue: str, n: int) -> list[str]:
    """``n`` tasks of ``queue`` held by a worker, as kombu's unacked hash shows them (not in
    unacked_index, so no worker ever restores them)."""
    tags = [f"bp-test-{uuid.uuid4().hex}" for _ in range(n)]
    sync.hset("unacked", mapping={t: json.dumps([{}, queue, queue]) for t in tags})
    return tags


def test_one_slow_task_in_flight_does_not_make_a_lone_request_wait_long(redis_url: str) -> None:
    """Issue 17: answers one at a time, ~14 s each; while the next one runs, the queue is busy with
    no completion for its whole time. That must not turn into a predicted wait past a 30 s deadline."""
    queue = f"bp-{uuid.uuid4().hex[:8]}"
    keys = Keys(f"ragline-test-{uuid.uuid4().hex[:8]}")
    sync = redis.Redis.from_url(redis_url)

    async def scenario() -> list[QueueLoad]:
        monitor = _monitor(redis_url, keys, (queue,), tau_s=5.0)
        t = 1_000_000
        seen = []

        async def at(ms: int) -> QueueLoad:
            await asyncio.sleep(0.002)  # past the 1 ms lease
            return (await monitor.refresh(now_ms=ms)).load(queue)

        for _ in range(3):  # three lone answers of 14 s each, refreshed every 250 ms
            tags = _plant_in_flight(sync, queue, 1)
            for _ in range(14 * 4):
                t += 250
                await at(t)
            sync.hdel("unacked", *tags)
            _counted(sync, keys, queue, (14.0, 1.0), slots=8)
            t += 250
            await at(t)
        tags = _plant_in_flight(sync, queue, 1)  # a slower one: 35 s and still running
        for _ in range(35 * 4):
            t += 250
            seen.append(await at(t))
        sync.hdel("unacked", *tags)
        return seen

    seen = asyncio.run(scenario())
    assert all(load.depth == 1 for load in seen)
    worst = max(load.predicted_wait_s() for load in seen)
    assert worst < 30.0, f"a lone request next to one in flight was predicted to wait {worst:.1f} s"
    # It finds a free slot: its own time at the concurrency of two, which lone tasks put at theirs.
    assert all(load.predicted_wait_s() == pytest.approx(14.0) for load in seen)


def test_stop_does_not_wait_on_a_refresh_that_lost_its_cancellation(redis_url: str) -> None:
    """redis-py's asyncio client can lose a cancellation that comes as a call starts, and the
    refresh loop then runs on: stop gives up after its bound instead of hanging the shutdown."""
    monitor = _monitor(redis_url, Keys("ragline-test-stop"), ("q",))

    async def deaf() -> None:  # as the loop behaves once a cancellation is lost
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(30)

    async def scenario() -> float:
        monitor.run = deaf  # type: ignore[method-assign]
        monitor.start()
        await asyncio.sleep(0.01)
        started = time.monotonic()
        await monitor.stop(timeout_s=0.2)
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 1.0
