"""The backpressure monitor: how much work waits on each queue and how long its tasks take.

Per queue, from Redis as kombu lays it out (see ARCHITECTURE.md): the waiting depth is the sum of
LLEN over the queue's priority lists, the in-flight count is that queue's entries in kombu's
``unacked`` hash (prefetch is 1, so that is what the workers hold, running or about to), and the
true depth is both. Workers report each finished task (:func:`count_done`): its requests, its
seconds in the worker, how many tasks that worker ran at once meanwhile, and how many it can run
at once. A batching engine serves a task in a time that depends on how many it batches with, so
a new request's predicted wait is read from the recent tasks' times at the concurrency it will
find, learnt per concurrency level (:mod:`ragline.broker.limits.service_times`; see
:meth:`QueueLoad.predicted_wait_s`), never from a completion rate: while one slow task
runs alone no completion comes, and a rate measured then fell towards zero and predicted hours.

Measuring costs one Lua script (``backpressure.lua``) and is done at most every
``backpressure_refresh_ms`` across all API processes: the script takes a short lease, and the one
process that gets it measures and writes the shared snapshot; every other caller receives the
snapshot in the same round trip. Each API process runs :meth:`BackpressureMonitor.run` in the
background and keeps the latest snapshot in memory, so a request never waits on Redis for it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from celery.signals import task_postrun, task_prerun
from kombu.transport.redis import PRIORITY_STEPS, Channel
from ragline.broker import metrics
from ragline.broker.limits.service_times import BUCKETS, Level, ServiceTimes, bucket
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.scripts import AsyncStateScript, lua

log = logging.getLogger(__name__)

_REFRESH = lua(__package__, "backpressure")

# A queue where work waits and nothing has finished for this many times a task's expected time
# (and at least STALL_MIN_S) is stalled: its predicted wait is infinite.
STALL_FACTOR = 4.0
STALL_MIN_S = 5.0


def priority_lists(queue: str) -> list[str]:
    """The Redis lists kombu spreads one queue over, one per priority step (``q``, ``q\\x06\\x163``, ...)."""
    return [f"{queue}{Channel.sep}{p}" if p else queue for p in PRIORITY_STEPS]


def count_done(
    pipe: Any,
    keys: Keys,
    queue: str,
    requests: int,
    seconds: float = 0.0,
    *,
    concurrency: float = 1.0,
    slots: int = 1,
) -> None:
    """Add one finished task to a worker's pipeline (no extra round trip): ``requests`` requests
    served in ``seconds``, while its worker ran ``concurrency`` tasks at once on average (itself
    included), out of the ``slots`` it can run at once (a solo pool's 1 by default). Counted in
    the task's concurrency bucket (see :mod:`ragline.broker.limits.service_times`)."""
    done, b = keys.done(queue), bucket(concurrency)
    pipe.hincrby(done, f"b{b}_tasks", 1)
    pipe.hincrby(done, f"b{b}_requests", requests)
    pipe.hincrbyfloat(done, f"b{b}_concurrency", concurrency)
    if seconds > 0:
        pipe.hincrbyfloat(done, f"b{b}_seconds", seconds)
    pipe.hset(done, "slots", slots)


class Occupancy:
    """How many tasks of one name a worker process runs at once, averaged over each task's time.

    :meth:`track` connects it to Celery's ``task_prerun`` and ``task_postrun``, which run in the
    task's own thread, postrun however the task ends; the task itself only asks :meth:`mean`
    when it reports its completion.
    """

    def __init__(self, slots: int) -> None:
        self.slots = max(1, slots)
        self._lock = threading.Lock()
        self._running = 0
        self._area = 0.0  # task-seconds run so far, all tasks together
        self._at = time.monotonic()
        self._mine = threading.local()  # this thread's task: (when it began, area then)

    def _advance(self) -> float:
        now = time.monotonic()
        self._area += self._running * (now - self._at)
        self._at = now
        return now

    def enter(self) -> None:
        with self._lock:
            now = self._advance()
            self._running += 1
            self._mine.entered = (now, self._area)

    def leave(self) -> None:
        with self._lock:
            self._advance()
            self._running = max(0, self._running - 1)
        self._mine.entered = None

    def mean(self) -> float:
        """Tasks running at once (this thread's included) on average since its task began; 1 outside one."""
        entered = getattr(self._mine, "entered", None)
        if entered is None:
            return 1.0
        with self._lock:
            now = self._advance()
            began, area = entered
            return (self._area - area) / (now - began) if now > began else float(self._running)

    def track(self, task_name: str) -> Occupancy:
        def prerun(sender: Any = None, **_: object) -> None:
            if getattr(sender, "name", None) == task_name:
                self.enter()

        def postrun(sender: Any = None, **_: object) -> None:
            if getattr(sender, "name", None) == task_name:
                self.leave()

        task_prerun.connect(prerun, weak=False)
        task_postrun.connect(postrun, weak=False)
        return self


@dataclass(frozen=True, slots=True)
class QueueLoad:
    queue: str
    waiting: int = 0  # in the priority lists
    in_flight: int = 0  # delivered to a worker, not yet acknowledged
    known: bool = False  # a task has finished: its service times mean something
    live_workers: int = 0  # workers with a fresh heartbeat on this queue
    slots: int = 1  # tasks one worker runs at once, as its tasks report it
    service: ServiceTimes = field(default_factory=ServiceTimes)
    busy_s: float = 0.0  # how long work has waited in the queue without a task finishing
    rate: float = 0.0  # requests completed per second while busy (EWMA; a gauge, not used to admit)

    @property
    def depth(self) -> int:
        """True depth in tasks: what a new task has ahead of it (and what an autoscaler should see)."""
        return self.waiting + self.in_flight

    @property
    def stalled(self) -> bool:
        """Work waiting and nothing finished for many times what the tasks in flight should take."""
        if self.waiting == 0:
            return False
        running = min(self.slots, max(1.0, self.in_flight / max(1, self.live_workers)))
        return self.busy_s > max(STALL_MIN_S, STALL_FACTOR * self.service.at(running))

    def predicted_wait_s(self, extra_requests: int = 0) -> float:
        """Seconds until a request arriving now has its answer from this queue.

        The workers run ``slots`` tasks each at once (a generation worker: its engine's batch; a
        retrieval worker: one batch). Each generation worker holds one engine, so a host with
        one engine per GPU counts one live worker per engine, and a backlog drains through all of
        them: N engines predict about 1/N of one engine's wait for it. With a slot free (what the
        queue holds, plus this one, fits in them all), the new task starts at once and takes its
        own time at the concurrency it joins. Otherwise it waits for as many tasks to finish as
        it is past the slots, the slots freeing one every service time / capacity at full
        concurrency, and then takes its own time there. ``extra_requests`` are admitted but not
        yet on the queue, counted as tasks at the recent requests per task (a retrieval task is
        a coalesced batch; for generation a task is one request). Before any task has finished:
        0 (a cold start admits; the fixed depth limits are the guard until then); a stalled
        queue: infinity.
        """
        if not self.known:
            return 0.0
        if self.stalled:
            return math.inf
        workers = max(1, self.live_workers)
        capacity = self.slots * workers
        tasks = self.depth + extra_requests / self.service.requests_per_task + 1  # this one included
        if tasks <= capacity:
            return self.service.at(max(1.0, tasks / workers))
        full = self.service.at(self.slots)
        return (tasks - capacity) / capacity * full + full


@dataclass(frozen=True, slots=True)
class Snapshot:
    at_ms: int  # Redis time of the measurement
    queues: dict[str, QueueLoad] = field(default_factory=dict)
    received: float = 0.0  # time.monotonic() in this process when it arrived

    def load(self, queue: str) -> QueueLoad:
        return self.queues.get(queue) or QueueLoad(queue)


def parse(fields: list[bytes] | list[str], queues: tuple[str, ...], *, received: float = 0.0) -> Snapshot:
    """The snapshot from the hash's fields as a flat [name, value, ...] list."""
    flat = [f.decode() if isinstance(f, bytes) else str(f) for f in fields]
    values = dict(zip(flat[0::2], flat[1::2], strict=True))

    def num(queue: str, name: str) -> float:
        try:
            return float(values.get(f"{queue}:{name}", 0))
        except ValueError:
            return 0.0

    loads = {
        q: QueueLoad(
            queue=q,
            waiting=int(num(q, "waiting")),
            in_flight=int(num(q, "in_flight")),
            known=num(q, "known") > 0,
            live_workers=int(num(q, "live_workers")),
            slots=max(1, int(num(q, "slots"))),
            service=ServiceTimes(
                tuple(
                    Level(*(num(q, f"fit{b}_{name}") for name in ("n", "r", "c", "s")))
                    for b in range(BUCKETS)
                )
            ),
            busy_s=num(q, "busy_ms") / 1000,
            rate=num(q, "rate"),
        )
        for q in queues
    }
    return Snapshot(at_ms=int(float(values.get("t", 0))), queues=loads, received=received)


class BackpressureMonitor:
    """Keeps this process's copy of the shared snapshot fresh; see the module docstring."""

    def __init__(
        self,
        client: aioredis.Redis,
        keys: Keys,
        queues: tuple[str, ...],
        *,
        refresh_s: float,
        tau_s: float,
        heartbeat_ttl_s: float,
        timeout_s: float = 1.0,
    ) -> None:
        self._keys = keys
        self._queues = queues
        self._refresh_s = refresh_s
        self._tau_s = tau_s
        self._heartbeat_ttl_s = heartbeat_ttl_s
        self._timeout_s = timeout_s
        self._script = AsyncStateScript(client, _REFRESH)
        self._script_keys = [keys.backpressure, keys.backpressure_lease, Channel.unacked_key]
        for q in queues:
            self._script_keys += [keys.done(q), *priority_lists(q), keys.workers(q)]
        self._snapshot: Snapshot | None = None
        self._task: asyncio.Task[None] | None = None
        self.refreshed = 0  # how many refreshes this process won (tests and curiosity)

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def age_s(self) -> float:
        return math.inf if self._snapshot is None else time.monotonic() - self._snapshot.received

    async def refresh(self, *, now_ms: int | None = None) -> Snapshot:
        """One round trip: measure (if this process wins the lease) or fetch the shared snapshot."""
        lease_ms = max(1, round(self._refresh_s * 1000))
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation that
        # arrives as the call completes.
        async with asyncio.timeout(self._timeout_s):
            won, fields = await self._script(
                keys=self._script_keys,
                args=[
                    lease_ms,
                    self._tau_s,
                    "" if now_ms is None else now_ms,
                    self._heartbeat_ttl_s,
                    *self._queues,
                ],
            )
        self.refreshed += int(won)
        snapshot = parse(fields, self._queues, received=time.monotonic())
        if snapshot.at_ms:  # an empty hash (nobody measured yet) tells nothing
            self._snapshot = snapshot
            for load in snapshot.queues.values():
                metrics.QUEUE_DEPTH.labels(load.queue).set(load.depth)
                metrics.QUEUE_RATE.labels(load.queue).set(load.rate)
                metrics.LIVE_WORKERS.labels(load.queue).set(load.live_workers)
        return snapshot

    async def run(self) -> None:
        """Refresh every ``refresh_s`` until cancelled; failures are logged and retried."""
        failures = 0
        while True:
            started = time.monotonic()
            try:
                await self.refresh()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                # One line per burst of failures, not one every 50 ms.
                if failures == 1 or failures % 200 == 0:
                    log.warning("backpressure refresh failed (%d in a row)", failures, exc_info=True)
            await asyncio.sleep(max(0.0, self._refresh_s - (time.monotonic() - started)))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run(), name="backpressure")

    async def stop(self, *, timeout_s: float = 2.0) -> None:
        """Cancel the refresh loop and wait for it, at most ``timeout_s``: a cancellation that
        comes as the loop starts can be lost (seen on Python 3.11: the task then never ends), and
        a shutdown must not wait on it."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        _, pending = await asyncio.wait({task}, timeout=timeout_s)
        if pending:
            log.warning("the backpressure refresh did not stop within %.0f s of its cancellation", timeout_s)
