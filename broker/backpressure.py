"""The backpressure monitor: how much work waits on each queue and how fast it is served.

Per queue, from Redis as kombu lays it out (see ARCHITECTURE.md): the waiting depth is the sum of
LLEN over the queue's priority lists, the in-flight count is that queue's entries in kombu's
``unacked`` hash (prefetch is 1, so that is what the workers hold, running or about to), and the
true depth is both. The service rate is an exponentially weighted rate of completions, fed by the
workers' ``done`` counters, which also carry each task's time in the worker. By Little's law a
new request has its answer after about (depth + 1) / rate, the work ahead of it and then its
own, but never sooner than one task alone takes (see :meth:`QueueLoad.predicted_wait_s`).

Measuring costs one Lua script (``backpressure.lua``) and is done at most every
``backpressure_refresh_ms`` across all API processes: the script takes a short lease, and the one
process that gets it measures and writes the shared snapshot; every other caller receives the
snapshot in the same round trip. Each API process runs :meth:`BackpressureMonitor.run` in the
background and keeps the latest snapshot in memory, so a request never waits on Redis for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from kombu.transport.redis import PRIORITY_STEPS, Channel

from broker import metrics
from broker.keys import Keys

log = logging.getLogger(__name__)

_REFRESH = resources.files("broker").joinpath("backpressure.lua").read_text()


def priority_lists(queue: str) -> list[str]:
    """The Redis lists kombu spreads one queue over, one per priority step (``q``, ``q\\x06\\x163``, ...)."""
    return [f"{queue}{Channel.sep}{p}" if p else queue for p in PRIORITY_STEPS]


def count_done(pipe: Any, keys: Keys, queue: str, requests: int, seconds: float = 0.0) -> None:
    """Add one finished task of ``requests`` requests, served in ``seconds``, to a worker's
    pipeline (no extra round trip)."""
    pipe.hincrby(keys.done(queue), "requests", requests)
    pipe.hincrby(keys.done(queue), "tasks", 1)
    if seconds > 0:
        pipe.hincrbyfloat(keys.done(queue), "seconds", seconds)


@dataclass(frozen=True, slots=True)
class QueueLoad:
    queue: str
    waiting: int = 0  # in the priority lists
    in_flight: int = 0  # delivered to a worker, not yet acknowledged
    rate: float = 0.0  # requests completed per second while busy (EWMA)
    task_rate: float = 0.0  # tasks completed per second while busy (EWMA)
    known: bool = False  # a completion has been seen: the rate means something
    live_workers: int = 0  # workers with a fresh heartbeat on this queue
    service_s: float = 0.0  # one task's time in a worker served alone (lower envelope of recent ones)

    @property
    def depth(self) -> int:
        """True depth in tasks: what a new task has ahead of it (and what an autoscaler should see)."""
        return self.waiting + self.in_flight

    def predicted_wait_s(self, extra_requests: int = 0) -> float:
        """Seconds until a request arriving now has its answer from this queue (Little's law).

        It waits for the ``depth`` tasks ahead and then for its own: (depth + 1) / task rate, but
        never less than one task's own service time (a worker serving many tasks at once, like
        a batching engine, completes them faster than it serves any one of them), plus
        ``extra_requests`` / request rate for requests admitted but not yet on the queue.
        Counted in tasks, a retrieval batch of 64 counts once, as it is served; for generation a
        task is one request. An empty queue with no known rate predicts 0 (a cold start admits);
        a queue with a known rate near zero (stalled) predicts infinity; unknown rate: 0 (admit;
        the fixed depth limits are the guard until the first completion).
        """
        if not self.known:
            return 0.0
        if self.task_rate <= 1e-9 or self.rate <= 1e-9:
            return 0.0 if self.depth == 0 and extra_requests == 0 else math.inf
        return max(self.service_s, (self.depth + 1) / self.task_rate) + extra_requests / self.rate


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
            rate=num(q, "rate"),
            task_rate=num(q, "task_rate"),
            known=num(q, "known") > 0,
            live_workers=int(num(q, "live_workers")),
            service_s=num(q, "service"),
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
        self._script = client.register_script(_REFRESH)
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
        won, fields = await asyncio.wait_for(
            self._script(
                keys=self._script_keys,
                args=[
                    lease_ms,
                    self._tau_s,
                    "" if now_ms is None else now_ms,
                    self._heartbeat_ttl_s,
                    *self._queues,
                ],
            ),
            self._timeout_s,
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

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
