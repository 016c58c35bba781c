"""The hooks tasks share (``workers/task_call.py``), one per concern.

Their order in a task's list matters where one relies on another: ``Cancellation`` and
``RequeueOn`` come after the ``TrackJob`` they serve, so that their ``after`` sees the body's
error first and a cancelled or requeued request is not also failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar

from celery.exceptions import Reject
from ragline.broker import metrics
from ragline.broker.contract.messages import Cancelled, ContractError, Error
from ragline.broker.streams.events import EventWriter
from ragline.workers.task_call import (
    REDIS_UNREACHABLE,
    Hook,
    P,
    Skip,
    TaskCall,
    TaskCancelled,
    TaskRefused,
    passes_through,
)

log = logging.getLogger(__name__)


class DecodePayload(Hook[P]):
    """Decodes (and so validates) the payload, first of all. One that breaks the contract is
    logged and dropped, acknowledged: a redelivery would fail the same way, so it is never
    retried."""

    def __init__(self, model: type[P]) -> None:
        self.model = model

    def before(self, call: TaskCall[P]) -> None:
        try:
            call.payload = self.model.decode(call.kwargs)
        except ContractError as exc:
            log.error("rejected %s task %s: %s", call.name, call.task_id, exc)
            raise Skip("its payload breaks the contract") from None


class QueueWait(Hook[P]):
    """``ragline_queue_wait_seconds`` of ``queue``: how long each request the task carries
    waited there, from its ``enqueued_at`` to the moment the worker picked the task."""

    def __init__(self, queue: str, enqueued_at: Callable[[TaskCall[P]], Iterable[float]]) -> None:
        self.queue = queue
        self.enqueued_at = enqueued_at

    def before(self, call: TaskCall[P]) -> None:
        histogram = metrics.QUEUE_WAIT_SECONDS.labels(self.queue)
        for enqueued_at in self.enqueued_at(call):
            histogram.observe(max(0.0, call.picked_at - enqueued_at))


class SkipExpired(Hook[P]):
    """Drops a task picked after its payload's ``deadline`` (Unix seconds): whoever waited for
    it has answered without it (a backlog, or a redelivery after a crash)."""

    def __init__(self, deadline: Callable[[P], float]) -> None:
        self.deadline = deadline

    def before(self, call: TaskCall[P]) -> None:
        if call.picked_at > self.deadline(call.payload):
            log.info("skipped %s task %s: past its deadline", call.name, call.task_id)
            raise Skip("past its deadline")


class Tracked(Protocol):
    """A request as its task drives it: its event stream, and its job record when it is a job."""

    def start(self, stage: str) -> bool:
        """The task begins ``stage``; False when the request finished already (a redelivery)
        or its job was cancelled or is gone."""
        ...

    def fail(self, error: Error) -> None:
        """End the request (and its job) with ``error``."""
        ...

    def cancel_requested(self) -> bool:
        """Whether the request was cancelled since it started."""
        ...

    def end_cancelled(self) -> None:
        """What a task that stopped for a cancel leaves behind."""
        ...


T = TypeVar("T", bound=Tracked)


class TrackJob(Hook[P], Generic[P, T]):
    """Job tracking: opens the request's :class:`Tracked` (``open``), moves it to ``stage`` or
    skips a task whose request is finished or whose job was cancelled, and ends a request
    whose body failed with an ``error`` event (finishing its job): a TaskRefused's status and
    message, else a 500 saying ``{failed} failed``. Redis out of reach fails nothing: the task
    is requeued (``REDIS_UNREACHABLE``)."""

    def __init__(self, stage: str, open: Callable[[TaskCall[P]], T], *, failed: str) -> None:
        self.stage = stage
        self.open = open
        self.failed = failed

    def tracked(self, call: TaskCall[P]) -> T:
        tracked: T = call.get(self)
        return tracked

    def before(self, call: TaskCall[P]) -> None:
        tracked = self.open(call)
        call.put(self, tracked)
        if not tracked.start(self.stage):
            raise Skip(f"finished already, or its job was cancelled before {self.stage}")

    def after(self, call: TaskCall[P], error: BaseException | None) -> BaseException | None:
        # Redis out of reach: the task goes back to its queue, its request is not failed.
        if passes_through(error) or isinstance(error, (TaskCancelled, *REDIS_UNREACHABLE)):
            return error
        if isinstance(error, TaskRefused):
            event = Error(status=error.status, message=str(error))
        else:
            log.error("%s failed (%s task %s)", self.failed, call.name, call.task_id, exc_info=error)
            event = Error(status=500, message=f"{self.failed} failed: {error}")
        self.tracked(call).fail(event)
        return None


class Cancellation(Hook[P]):
    """Cancellation: the body calls :meth:`check` where it can stop, which raises TaskCancelled
    once the request was cancelled (the body may raise it itself); a task that stopped so ends
    acknowledged, leaving what its request's ``end_cancelled`` writes."""

    def __init__(self, job: TrackJob[P, Any]) -> None:
        self.job = job

    def check(self, call: TaskCall[P]) -> None:
        if self.job.tracked(call).cancel_requested():
            raise TaskCancelled(f"{call.name} task {call.task_id} cancelled")

    def after(self, call: TaskCall[P], error: BaseException | None) -> BaseException | None:
        if not isinstance(error, TaskCancelled):
            return error
        log.info("%s task %s stopped: its request was cancelled", call.name, call.task_id)
        self.job.tracked(call).end_cancelled()
        return None


class RequeueOn(Hook[P]):
    """Gives the task back to its queue when the body raises one of ``errors`` (an engine that
    died, a worker that is stopping): Celery's Reject with requeue, so another worker takes it
    at once; with ``acks_late`` nothing accepted is lost."""

    def __init__(self, *errors: type[BaseException]) -> None:
        self.errors = errors

    def after(self, call: TaskCall[P], error: BaseException | None) -> BaseException | None:
        if error is None or not isinstance(error, self.errors):
            return error
        log.warning("%s task %s requeued: %s", call.name, call.task_id, error)
        reject = Reject(str(error), requeue=True)
        reject.__cause__ = error
        return reject


class RequestEvents:
    """A query's request as tracked through its event stream (:class:`EventWriter`, which
    mirrors the events into the job record when the request is a job); a failure completes a
    task of ``queue`` for the backpressure monitor, as any final event does."""

    def __init__(self, writer: EventWriter, *, queue: str, picked_at: float) -> None:
        self.writer = writer
        self.queue = queue
        self.picked_at = picked_at

    def start(self, stage: str) -> bool:
        return self.writer.start(stage)

    def fail(self, error: Error) -> None:
        self.writer.emit(error, completes=self.queue, service_s=time.time() - self.picked_at)

    def cancel_requested(self) -> bool:
        return self.writer.cancelled

    def end_cancelled(self) -> None:
        self.writer.emit(Cancelled())
