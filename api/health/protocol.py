"""The body of ``GET /v1/health/queues``: each queue as admission sees it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

if TYPE_CHECKING:  # the client imports these models; it needs no Redis
    from ragline.api.pipeline.admission import AdmissionView, QueueView


def _finite(seconds: float) -> float | None:
    return None if math.isinf(seconds) else round(seconds, 3)


class ServiceLevel(BaseModel):
    concurrency: float = Field(description="Tasks running at once in a worker, the level's recent mean.")
    task_s: float = Field(description="A task's recent seconds in the worker at this level.")
    tasks: float = Field(description="Recent tasks the level's mean is taken from (recency-weighted).")


class QueueHealth(BaseModel):
    queue: str
    depth: int = Field(
        description="What a new task has ahead of it: tasks waiting in the queue's lists plus those "
        "workers hold (kombu's unacked). A retrieval task is one coalesced batch, a generation "
        "task one request."
    )
    waiting: int = Field(description="Tasks in the queue's lists, not yet taken by a worker.")
    in_flight: int = Field(description="Tasks workers hold, running or about to.")
    not_yet_queued: int = Field(
        description="Requests this API process admitted that the snapshot cannot show yet (in the "
        "coalescer, or in retrieval on their way to generation); admission counts them."
    )
    live_workers: int = Field(description="Workers consuming the queue with a fresh heartbeat.")
    slots: int = Field(description="Tasks one worker runs at once, as its tasks report it.")
    service_rate: float = Field(description="Requests completed per second while busy (EWMA).")
    task_s: float | None = Field(
        description="A task's measured seconds at full concurrency (all slots busy); null before "
        "any task has finished."
    )
    levels: list[ServiceLevel] = Field(
        description="What the prediction is read from: each concurrency level's measured task time "
        "(buckets 1, 2-4, 5-16, 17-64, 65-256 and more; the levels with tasks, by concurrency)."
    )
    predicted_wait_s: float | None = Field(
        description="Seconds a request arriving now is predicted to wait for this queue's answer, "
        "its own task included; null when the queue is stalled (work waits and nothing finishes)."
    )
    stalled: bool

    @classmethod
    def of(cls, view: QueueView) -> QueueHealth:
        load = view.load
        return cls(
            queue=view.queue,
            depth=load.depth,
            waiting=load.waiting,
            in_flight=load.in_flight,
            not_yet_queued=view.not_yet_queued,
            live_workers=load.live_workers,
            slots=load.slots,
            service_rate=round(load.rate, 3),
            task_s=_finite(load.service.at(load.slots)) if load.known else None,
            levels=[
                ServiceLevel(concurrency=round(c, 2), task_s=round(s, 3), tasks=round(n, 2))
                for c, s, n in load.service.points()
            ],
            predicted_wait_s=_finite(view.predicted_wait_s),
            stalled=load.stalled,
        )


class QueuesHealth(BaseModel):
    admission_enabled: bool = Field(description="Requests are admitted, degraded or refused by these waits.")
    snapshot_age_s: float | None = Field(
        description="Age of the shared measurement this process decides on; null before the first."
    )
    fresh: bool = Field(
        description="Young enough to decide on; a stale snapshot (Redis unreachable) admits everything."
    )
    rag_wait_s: float | None = Field(
        description="A RAG request's predicted wait for its answer (retrieval's, then generation's), "
        "which admission holds against its deadline; null when a queue is stalled."
    )
    default_deadline_s: float = Field(description="A request's deadline without X-Request-Deadline-Ms.")
    queues: list[QueueHealth]

    @classmethod
    def of(cls, view: AdmissionView, *, default_deadline_s: float) -> QueuesHealth:
        return cls(
            admission_enabled=view.enabled,
            snapshot_age_s=_finite(view.snapshot_age_s),
            fresh=view.fresh,
            rag_wait_s=_finite(view.rag_wait_s),
            default_deadline_s=default_deadline_s,
            queues=[QueueHealth.of(q) for q in view.queues],
        )
