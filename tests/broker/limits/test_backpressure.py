"""The backpressure monitor on a real Redis, with real Celery messages laid out by kombu; its
arithmetic (service times, predicted waits, the snapshot's parsing, a finished task's sums) alone."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
import uuid
from dataclasses import astuple, replace

import pytest
import redis
import redis.asyncio as aioredis
from kombu import Connection, Consumer, Queue
from ragline.broker.celery_app import create_celery
from ragline.broker.config.settings import RedisSettings
from ragline.broker.limits.backpressure import (
    BackpressureMonitor,
    Occupancy,
    QueueLoad,
    ServiceTimes,
    count_done,
    parse,
    priority_lists,
)
from ragline.broker.limits.service_times import BUCKETS, KEEP, Level, bucket
from ragline.broker.redis.keys import Keys


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


def _isolated(redis_url: str) -> tuple[str, Keys, redis.Redis]:
    """A queue name and a key prefix of this test's own, and a client."""
    return (
        f"bp-{uuid.uuid4().hex[:8]}",
        Keys(f"ragline-test-{uuid.uuid4().hex[:8]}"),
        redis.Redis.from_url(redis_url),
    )


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
    queue, keys, sync = _isolated(redis_url)

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
    # Each task in its concurrency bucket (1, 2-4, 5-16, ...): sums of tasks, requests, c, seconds.
    assert first.service.levels[:3] == (Level(1, 1, 1, 2), Level(1, 1, 3, 4), Level())
    assert second.service.levels[:3] == (Level(1, 1, 1, 2), Level(1, 1, 3, 4), Level(1, 1, 5, 6))
    assert later.service == second.service  # a long gap changes nothing
    # Through (1, 2 s), (3, 4 s), (5, 6 s): one second more per task in the batch, and on past 5.
    assert second.service.at(1) == pytest.approx(2.0)
    assert second.service.at(4) == pytest.approx(5.0)
    assert second.service.at(8) == pytest.approx(9.0)


def test_a_levels_earlier_tasks_weigh_less_per_later_task_of_that_level_only(redis_url: str) -> None:
    queue, keys, sync = _isolated(redis_url)

    async def scenario() -> list[QueueLoad]:
        monitor = _monitor(redis_url, keys, (queue,))
        await _at(monitor, queue, 1_000_000)
        _counted(sync, keys, queue, (2.0, 1.0), (8.0, 4.0), slots=8)
        first = await _at(monitor, queue, 1_001_000)
        _counted(sync, keys, queue, (12.0, 3.6), (12.0, 4.2), slots=8)
        return [first, await _at(monitor, queue, 1_002_000)]

    first, second = asyncio.run(scenario())
    keep = KEEP**2  # two later tasks in the 2-4 bucket
    assert astuple(second.service.levels[1]) == pytest.approx(
        (keep + 2, keep + 2, 4 * keep + 7.8, 8 * keep + 24)
    )
    assert second.service.levels[0] == first.service.levels[0]  # the lone level keeps what it had
    # The replay's arithmetic is the script's.
    folded = ServiceTimes().fold([(1, 2.0, 1.0), (1, 8.0, 4.0)]).fold([(1, 12.0, 3.6), (1, 12.0, 4.2)])
    assert _flat(folded) == pytest.approx(_flat(second.service))


def test_every_task_is_counted_whatever_its_seconds_round_to(redis_url: str) -> None:
    """The snapshot kept each bucket's totals rounded to 6 decimals, and a total rounded up read
    as a counter that went backwards at every later refresh: nothing was counted from then on, in
    any bucket, and admission predicted from the lone requests of the warm-up under any load."""
    queue, keys, sync = _isolated(redis_url)

    async def scenario() -> list[QueueLoad]:
        monitor = _monitor(redis_url, keys, (queue,))
        await _at(monitor, queue, 1_000_000)
        _counted(sync, keys, queue, (2.0000007, 1.0), slots=8)  # 2.000001 at 6 decimals: up
        first = await _at(monitor, queue, 1_001_000)
        _counted(sync, keys, queue, (9.0, 8.0), slots=8)  # another level, the next refresh
        second = await _at(monitor, queue, 1_002_000)
        _counted(sync, keys, queue, (3.0, 1.0), slots=8)  # the first level again
        return [first, second, await _at(monitor, queue, 1_003_000)]

    first, second, third = asyncio.run(scenario())
    assert first.service.levels[0].n == 1
    assert second.service.levels[2] == Level(1, 1, 8, 9)
    assert third.service.levels[0].n == pytest.approx(KEEP + 1)
    assert third.service.levels[0].s == pytest.approx(2.0000007 * KEEP + 3.0)


def _flat(service: ServiceTimes) -> list[float]:
    return [x for level in service.levels for x in astuple(level)]


def test_service_time_against_concurrency() -> None:
    # Between measured levels: on the line between their means.
    line = ServiceTimes.of((2.0, 1.0), (4.0, 3.0), (6.0, 5.0))
    assert line.at(2) == pytest.approx(3.0) and line.at(4.5) == pytest.approx(5.5)
    # A level is the mean of its tasks, whatever other levels hold.
    assert ServiceTimes.of((6.0, 1.0), (2.0, 3.0), (4.0, 3.0)).at(3) == pytest.approx(3.0)
    # One level measured: flat above it (company costs nothing), proportional below it (the
    # engine's throughput fixed). Both err towards admitting.
    lone = ServiceTimes.of((14.0, 1.0), (13.0, 1.0), (15.0, 1.0))
    assert lone.at(1) == pytest.approx(14.0) and lone.at(8) == pytest.approx(14.0)
    full = ServiceTimes.of((20.0, 8.0), (22.0, 8.0))
    assert full.at(8) == pytest.approx(21.0) and full.at(1) == pytest.approx(21.0 / 8)
    assert full.at(64) == pytest.approx(21.0)
    assert ServiceTimes().at(3) == 0.0
    # Above the highest of several: the line through the two highest goes on, its slope between
    # flat and proportional (what a CPU engine measured at 8 takes at 24: far more than at 8).
    cpu = ServiceTimes.of((2.3, 1.0), (3.2, 3.6), (4.2, 7.7))
    assert cpu.at(24) == pytest.approx(4.2 + (4.2 - 3.2) / (7.7 - 3.6) * (24 - 7.7))
    assert ServiceTimes.of((4.0, 1.0), (2.0, 4.0)).at(16) == pytest.approx(2.0)  # never faster
    steep = ServiceTimes.of((1.0, 1.0), (8.0, 4.0))
    assert steep.at(8) == pytest.approx(8.0 + 2.0 * 4)  # proportional at most


def test_each_level_is_read_from_its_own_tasks() -> None:
    """An engine whose step barely grows to 8 sequences and then does: one line through every
    level misses both ends; per level, each is what its own tasks took, however many lone ones
    there were."""
    service = ServiceTimes.of(*[(1.0, 1.0)] * 30, *[(1.1, 8.0)] * 5, *[(2.0, 64.0)] * 5)
    assert service.at(1) == pytest.approx(1.0)
    assert service.at(8) == pytest.approx(1.1)
    assert service.at(64) == pytest.approx(2.0)
    assert service.at(36) == pytest.approx(1.1 + 0.9 * 28 / 56)
    assert [c for c, _, _ in service.points()] == pytest.approx([1.0, 8.0, 64.0])


def test_concurrency_buckets() -> None:
    assert [bucket(c) for c in (0.4, 1.0, 1.4, 1.6, 4.0, 4.4, 4.6, 16, 17, 64, 65, 256, 257, 5000)] == [
        0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5
    ]  # fmt: skip
    assert BUCKETS == 6


def test_the_snapshot_is_parsed_from_the_hash_with_defaults_for_what_is_missing_or_bad() -> None:
    fields = [
        b"t", b"1700000000123",
        b"generation:waiting", b"3", b"generation:in_flight", b"2", b"generation:known", b"1",
        b"generation:live_workers", b"2", b"generation:slots", b"8",
        b"generation:fit1_n", b"2", b"generation:fit1_r", b"2", b"generation:fit1_c", b"6",
        b"generation:fit1_s", b"8", b"generation:fit3_n", b"1", b"generation:fit3_r", b"1",
        b"generation:fit3_c", b"20", b"generation:fit3_s", b"7",
        b"generation:busy_ms", b"1500", b"generation:rate", b"0.25",
        b"retrieval:waiting", b"lots", b"retrieval:slots", b"0",
    ]  # fmt: skip
    snapshot = parse(fields, ("generation", "retrieval", "ingest"), received=7.0)
    assert snapshot.at_ms == 1_700_000_000_123 and snapshot.received == 7.0
    assert snapshot.load("generation") == QueueLoad(
        "generation",
        waiting=3,
        in_flight=2,
        known=True,
        live_workers=2,
        slots=8,
        service=ServiceTimes((Level(), Level(2, 2, 6, 8), Level(), Level(1, 1, 20, 7), Level(), Level())),
        busy_s=1.5,
        rate=0.25,
    )
    assert snapshot.load("generation").depth == 5
    # A value that is no number counts as none; a worker runs at least one task at once.
    assert snapshot.load("retrieval") == QueueLoad("retrieval")
    assert snapshot.load("ingest") == QueueLoad("ingest")  # a queue the hash does not mention
    assert snapshot.load("callbacks") == QueueLoad("callbacks")  # one not asked for either
    assert parse([], ("generation",)).at_ms == 0  # nobody measured yet: an empty hash


def test_a_finished_task_adds_the_sums_its_queues_fit_is_made_of() -> None:
    class Pipe:
        def __init__(self) -> None:
            self.calls: list[tuple[str, str, str, float]] = []

        def hincrby(self, key: str, name: str, n: int) -> None:
            self.calls.append(("hincrby", key, name, n))

        def hincrbyfloat(self, key: str, name: str, x: float) -> None:
            self.calls.append(("hincrbyfloat", key, name, x))

        def hset(self, key: str, name: str, value: int) -> None:
            self.calls.append(("hset", key, name, value))

    keys, pipe = Keys("t-done"), Pipe()
    count_done(pipe, keys, "generation", 1, 2.5, concurrency=3.0, slots=8)
    done = keys.done("generation")
    assert pipe.calls == [  # in the bucket of 2-4 at once
        ("hincrby", done, "b1_tasks", 1),
        ("hincrby", done, "b1_requests", 1),
        ("hincrbyfloat", done, "b1_concurrency", 3.0),
        ("hincrbyfloat", done, "b1_seconds", 2.5),
        ("hset", done, "slots", 8),
    ]
    untimed = Pipe()
    count_done(untimed, keys, "retrieval", 16)  # a task that did not time itself: no seconds
    assert [c[2] for c in untimed.calls] == ["b0_tasks", "b0_requests", "b0_concurrency", "slots"]


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


@pytest.mark.parametrize("engines", [2, 4, 8])
def test_n_engines_predict_about_one_nth_the_wait_of_one_under_the_same_load(engines: int) -> None:
    """One generation worker per GPU: each engine batches its own 8 sequences at 0.5 s a task.
    The same backlog ahead of a request drains N times faster through N of them."""
    service = ServiceTimes.of((0.5, 8.0), (0.5, 8.0))
    one = QueueLoad(
        "generation", waiting=1000, in_flight=8, known=True, live_workers=1, slots=8, service=service
    )
    many = replace(one, in_flight=8 * engines, waiting=1008 - 8 * engines, live_workers=engines)
    assert one.depth == many.depth  # the same load: the same requests ahead
    assert many.predicted_wait_s() / one.predicted_wait_s() == pytest.approx(1 / engines, rel=0.02)
    # It starts once the tasks ahead of it past the N x 8 slots have finished, one every 0.5 s / (N x 8).
    ahead = one.depth + 1 - 8 * engines
    assert many.predicted_wait_s() == pytest.approx(ahead / (8 * engines) * 0.5 + 0.5)


def test_each_engines_heartbeat_counts_as_a_worker_of_the_generation_queue(redis_url: str) -> None:
    """Engines on 4 GPUs beat as 4 workers (ids host:pid:gpuN): the snapshot admission reads
    predicts a quarter of one engine's wait for the same backlog."""
    queue, keys, sync = _isolated(redis_url)

    async def scenario() -> list[QueueLoad]:
        monitor = _monitor(redis_url, keys, (queue,))
        t = 1_000_000
        await _at(monitor, queue, t)
        _counted(sync, keys, queue, *[(0.5, 8.0)] * 4, slots=8)
        sync.rpush(queue, *range(400))
        try:
            sync.zadd(keys.workers(queue), {"gpu-host:10:gpu0": (t + 1000) / 1000})
            one = await _at(monitor, queue, t + 1000)
            sync.zadd(keys.workers(queue), {f"gpu-host:1{i}:gpu{i}": (t + 2000) / 1000 for i in range(4)})
            four = await _at(monitor, queue, t + 2000)
        finally:
            sync.delete(queue)
        return [one, four]

    one, four = asyncio.run(scenario())
    assert (one.live_workers, four.live_workers) == (1, 4) and one.depth == four.depth == 400
    assert four.predicted_wait_s() / one.predicted_wait_s() == pytest.approx(0.25, rel=0.05)


def test_a_queue_busy_without_a_completion_for_long_is_stalled(redis_url: str) -> None:
    queue, keys, sync = _isolated(redis_url)

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
    queue, keys, sync = _isolated(redis_url)

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
    queue, keys, sync = _isolated(redis_url)

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
    monkeypatch.setattr("ragline.broker.limits.backpressure.time.monotonic", lambda: clock[0])
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
    queue, keys, sync = _isolated(redis_url)

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
    queue, keys, sync = _isolated(redis_url)

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
