"""Deadline-aware admission: admit, degrade to retrieval-only, or refuse with 503 + Retry-After.

The pipeline's admission step (:mod:`ragline.api.pipeline`) asks it before anything is enqueued, with
the request's deadline (clamped there). It reads this process's copy of the backpressure
snapshot (no I/O): a RAG request needs retrieval's and generation's
predicted waits (from measured service times at the concurrency it will find, see
:meth:`ragline.broker.limits.backpressure.QueueLoad.predicted_wait_s`) to fit its deadline; if only retrieval
fits, the request is answered with its sources alone (when it allows that); if retrieval does not
fit either, it is refused with a Retry-After computed from the predicted wait. Fixed per-queue
depth limits apply alongside.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from enum import Enum

from ragline.broker import metrics
from ragline.broker.config.settings import ApiSettings
from ragline.broker.contract.queues import GENERATION_QUEUE, RETRIEVAL_QUEUE
from ragline.broker.limits.backpressure import BackpressureMonitor, QueueLoad, Snapshot


class Action(Enum):
    ADMIT = "admit"
    DEGRADE = "degrade"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reason: str = ""
    message: str = ""  # a 503's message, or a degraded answer's notice
    retry_after_s: int = 0
    # What the request was predicted to wait for its answer (retrieval's alone when degraded);
    # None when nothing was predicted (admission off, no fresh snapshot).
    wait_s: float | None = None

    @property
    def degraded(self) -> bool:
        return self.action is Action.DEGRADE


ADMIT = Decision(Action.ADMIT)


@dataclass(frozen=True, slots=True)
class QueueView:
    """One queue as admission sees it: the shared snapshot's load, plus the requests this process
    admitted that the snapshot cannot show yet (``not_yet_queued``)."""

    queue: str
    load: QueueLoad
    not_yet_queued: int
    predicted_wait_s: float  # infinite when the queue is stalled


@dataclass(frozen=True, slots=True)
class AdmissionView:
    """What :meth:`Admission.decide` would read now (``GET /v1/health/queues``)."""

    enabled: bool
    snapshot_age_s: float  # infinite before the first snapshot
    fresh: bool  # young enough to decide on (else admission fails open)
    queues: tuple[QueueView, ...]

    def queue(self, name: str) -> QueueView | None:
        return next((q for q in self.queues if q.queue == name), None)

    @property
    def rag_wait_s(self) -> float:
        """What a RAG request is predicted to wait for its answer: retrieval's, then generation's."""
        return sum(q.predicted_wait_s for q in self.queues if q.queue in (RETRIEVAL_QUEUE, GENERATION_QUEUE))


def _seconds(value: float) -> str:
    return "unknown (the queue is not being served)" if math.isinf(value) else f"{value:.1f} s"


class Admission:
    def __init__(self, settings: ApiSettings, monitor: BackpressureMonitor | None) -> None:
        self._s = settings
        self._monitor = monitor
        # Requests this process admitted since the snapshot it decides on was taken: the snapshot
        # is up to ~50 ms old, and a burst inside that window must not all see the same queue.
        self._local_at = -1
        self._local_retrievals = 0
        # RAG requests admitted here that have not reached the generation queue yet: they wait
        # in the coalescer or in retrieval, invisible to generation's depth, and will be there
        # within a retrieval's time. Forgotten after the request timeout (an async job's
        # retrieval is never watched here).
        self._in_transit: dict[str, float] = {}

    def _retry_after(self, wait_s: float, deadline_s: float) -> int:
        # When the backlog ahead would have drained enough for a request with this deadline.
        if math.isinf(wait_s):
            return self._s.retry_after_max_s
        return int(min(self._s.retry_after_max_s, max(1, math.ceil(wait_s - deadline_s))))

    def _retrievals_since(self, at_ms: int) -> int:
        """Requests this process sent to retrieval since the snapshot taken at ``at_ms``."""
        if at_ms != self._local_at:
            self._local_at = at_ms
            self._local_retrievals = 0
        return self._local_retrievals

    def decide(self, mode: str, *, allow_degraded: bool, deadline_s: float) -> Decision:
        s = self._s
        monitor = self._monitor
        if not s.admission_enabled or monitor is None:
            return ADMIT
        snapshot = monitor.snapshot
        if snapshot is None or monitor.age_s() > s.backpressure_stale_s:
            return ADMIT  # fail open: without a measurement, refusing would turn a Redis blip into an outage
        retrieval, generation = snapshot.load(RETRIEVAL_QUEUE), snapshot.load(GENERATION_QUEUE)
        wait_r = retrieval.predicted_wait_s(self._not_yet_queued(RETRIEVAL_QUEUE, snapshot))
        retrieval_full = 0 < s.max_depth_retrieval <= retrieval.depth
        if retrieval_full or wait_r > deadline_s:
            reason = "retrieval_queue_full" if retrieval_full else "retrieval_busy"
            return self._reject(
                reason,
                f"overloaded: retrieval's predicted wait {_seconds(wait_r)} exceeds the deadline "
                f"{deadline_s:.1f} s" + (f" (queue depth {retrieval.depth})" if retrieval_full else ""),
                self._retry_after(wait_r, deadline_s),
            )
        if mode == "retrieval":
            return Decision(Action.ADMIT, wait_s=wait_r)
        in_transit = self._not_yet_queued(GENERATION_QUEUE, snapshot)
        wait = wait_r + generation.predicted_wait_s(in_transit)
        generation_full = 0 < s.max_depth_generation <= generation.depth + in_transit
        if not (generation_full or wait > deadline_s):
            return Decision(Action.ADMIT, wait_s=wait)
        reason = "generation_queue_full" if generation_full else "generation_busy"
        why = f"generation's predicted wait {_seconds(wait)} exceeds the deadline {deadline_s:.1f} s"
        if allow_degraded:
            metrics.DEGRADED.labels(reason).inc()
            return Decision(
                Action.DEGRADE,
                reason,
                f"Generation is busy ({why}): this answer has the retrieved sources only. "
                "Retry later for a generated answer, or send a longer X-Request-Deadline-Ms.",
                wait_s=wait_r,
            )
        return self._reject(reason, f"overloaded: {why}", self._retry_after(wait, deadline_s))

    def _not_yet_queued(self, queue: str, snapshot: Snapshot) -> int:
        """Requests this process sent towards ``queue`` that ``snapshot`` cannot count yet."""
        if queue == RETRIEVAL_QUEUE:
            return self._retrievals_since(snapshot.at_ms)
        if queue == GENERATION_QUEUE:
            return self._count_in_transit()
        return 0

    def view(self) -> AdmissionView:
        """Each measured queue as :meth:`decide` reads it now, with the same predicted waits."""
        monitor = self._monitor
        snapshot = monitor.snapshot if monitor is not None else None
        age_s = monitor.age_s() if monitor is not None else math.inf
        queues: list[QueueView] = []
        if snapshot is not None:
            for name, load in snapshot.queues.items():
                extra = self._not_yet_queued(name, snapshot)
                queues.append(QueueView(name, load, extra, load.predicted_wait_s(extra)))
        return AdmissionView(
            enabled=self._s.admission_enabled and monitor is not None,
            snapshot_age_s=age_s,
            fresh=snapshot is not None and age_s <= self._s.backpressure_stale_s,
            queues=tuple(queues),
        )

    def _reject(self, reason: str, message: str, retry_after_s: int) -> Decision:
        metrics.REJECTIONS.labels("overloaded").inc()
        return Decision(Action.REJECT, reason, message, retry_after_s)

    def admitted(self, mode: str, request_id: str) -> None:
        """A request was enqueued with this mode (after :meth:`decide`)."""
        if mode == "rag":
            self._in_transit[request_id] = time.monotonic()
        snapshot = self._monitor.snapshot if self._monitor else None
        if snapshot is not None:
            self._local_retrievals = self._retrievals_since(snapshot.at_ms) + 1

    def retrieved(self, request_id: str) -> None:
        """The request's retrieval answered: it is on the generation queue now (or done)."""
        self._in_transit.pop(request_id, None)

    def _count_in_transit(self) -> int:
        horizon = time.monotonic() - self._s.request_timeout_s
        while self._in_transit:
            oldest = next(iter(self._in_transit))  # insertion order is admission order
            if self._in_transit[oldest] >= horizon:
                break
            del self._in_transit[oldest]
        return len(self._in_transit)
