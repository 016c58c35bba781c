"""The shared task hooks, one concern each, with narrow fakes: a request that records what its
task did to it, and a writer that records its events."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from celery.exceptions import Reject, Retry
from prometheus_client import REGISTRY
from ragline.broker.contract.messages import Cancelled, Error, GenerateTask, WebhookDelivery
from ragline.workers.hooks import (
    Cancellation,
    DecodePayload,
    QueueWait,
    RequestEvents,
    RequeueOn,
    SkipExpired,
    TrackJob,
)
from ragline.workers.task_call import Skip, TaskCall, TaskCancelled, TaskRefused, run


@dataclass
class FakeRequest:
    """A request's stream and job, as a task drives it (hooks.Tracked)."""

    startable: bool = True
    cancel: bool = False
    started: list[str] = field(default_factory=list)
    failed: list[Error] = field(default_factory=list)
    ended_cancelled: int = 0

    def start(self, stage: str) -> bool:
        self.started.append(stage)
        return self.startable

    def fail(self, error: Error) -> None:
        self.failed.append(error)

    def cancel_requested(self) -> bool:
        return self.cancel

    def end_cancelled(self) -> None:
        self.ended_cancelled += 1


class EngineDied(RuntimeError):
    pass


def _call(payload: Any = None, *, picked_at: float = 100.0) -> TaskCall[Any]:
    call: TaskCall[Any] = TaskCall("ragline.test", {}, task_id="t1", picked_at=picked_at)
    if payload is not None:
        call.payload = payload
    return call


def _delivery() -> WebhookDelivery:
    return WebhookDelivery(job_id="j1", attempt=1)


def _chain(request: FakeRequest) -> tuple[TrackJob[Any, FakeRequest], Cancellation[Any], list[Any]]:
    job: TrackJob[Any, FakeRequest] = TrackJob("generating", lambda call: request, failed="generation")
    cancellation: Cancellation[Any] = Cancellation(job)
    return job, cancellation, [job, cancellation, RequeueOn(EngineDied)]


# -- DecodePayload ------------------------------------------------------------------------------


def test_decode_gives_the_body_its_typed_payload() -> None:
    call: TaskCall[WebhookDelivery] = TaskCall("ragline.deliver_webhook", {"job_id": "j1", "attempt": 2})
    DecodePayload(WebhookDelivery).before(call)
    assert call.payload == WebhookDelivery(job_id="j1", attempt=2)


def test_a_payload_that_breaks_the_contract_is_dropped_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    call: TaskCall[WebhookDelivery] = TaskCall("ragline.deliver_webhook", {"job_id": "j1"}, task_id="t9")
    with caplog.at_level(logging.ERROR), pytest.raises(Skip):
        DecodePayload(WebhookDelivery).before(call)
    [record] = caplog.records
    assert record.getMessage().startswith("rejected ragline.deliver_webhook task t9: WebhookDelivery")
    assert "attempt: Field required" in record.getMessage()


def test_a_payload_of_the_previous_release_still_decodes() -> None:
    """A generate task as the previous release queued it: the fields it had, none of the newer."""
    old = {"request_id": "r1", "query": "q", "sources": [], "enqueued_at": 1.0}
    call: TaskCall[GenerateTask] = TaskCall("ragline.generate", old)
    DecodePayload(GenerateTask).before(call)
    assert call.payload.request_id == "r1" and call.payload.partial_shards == ()


# -- QueueWait, SkipExpired -----------------------------------------------------------------------


def _observed(queue: str) -> tuple[float, float]:
    count = REGISTRY.get_sample_value("ragline_queue_wait_seconds_count", {"queue": queue}) or 0.0
    total = REGISTRY.get_sample_value("ragline_queue_wait_seconds_sum", {"queue": queue}) or 0.0
    return count, total


def test_queue_wait_observes_each_request_from_its_enqueue_to_the_pick() -> None:
    before = _observed("hooks-test")
    hook: QueueWait[Any] = QueueWait("hooks-test", lambda call: [99.0, 99.5, 101.0])
    hook.before(_call(picked_at=100.0))
    count, total = _observed("hooks-test")
    # One clock skew (enqueued after the pick) counts as no wait, never as a negative one.
    assert (count - before[0], round(total - before[1], 6)) == (3, 1.5)


def test_a_task_past_its_deadline_is_skipped() -> None:
    hook: SkipExpired[Any] = SkipExpired(lambda payload: payload["deadline"])
    hook.before(_call({"deadline": 100.5}, picked_at=100.0))
    with pytest.raises(Skip):
        hook.before(_call({"deadline": 99.0}, picked_at=100.0))


# -- TrackJob, Cancellation, RequeueOn ------------------------------------------------------------


def test_track_job_starts_the_stage_and_skips_a_finished_or_cancelled_request() -> None:
    request = FakeRequest()
    _, _, hooks = _chain(request)
    ran: list[str] = []
    run(_call(_delivery()), hooks, lambda call: ran.append("body"))
    assert request.started == ["generating"] and ran == ["body"] and request.failed == []

    gone = FakeRequest(startable=False)
    _, _, hooks = _chain(gone)
    run(_call(_delivery()), hooks, lambda call: ran.append("again"))
    assert ran == ["body"]  # skipped: not run, not failed
    assert gone.failed == []


def test_a_body_that_fails_ends_its_request_with_a_500(caplog: pytest.LogCaptureFixture) -> None:
    request = FakeRequest()
    _, _, hooks = _chain(request)

    def body(call: TaskCall[Any]) -> None:
        raise ValueError("bad prompt")

    with caplog.at_level(logging.ERROR):
        run(_call(_delivery()), hooks, body)  # dealt with: the task ends, acknowledged
    assert request.failed == [Error(status=500, message="generation failed: bad prompt")]
    assert "generation failed (ragline.test task t1)" in caplog.text


def test_a_refusal_ends_its_request_with_its_own_status() -> None:
    request = FakeRequest()
    _, _, hooks = _chain(request)

    def body(call: TaskCall[Any]) -> None:
        raise TaskRefused(409, "index is sharded")

    run(_call(_delivery()), hooks, body)
    assert request.failed == [Error(status=409, message="index is sharded")]


def test_a_dead_engine_requeues_the_task_without_failing_its_request() -> None:
    request = FakeRequest()
    _, _, hooks = _chain(request)
    dead = EngineDied("engine core died")

    def body(call: TaskCall[Any]) -> None:
        raise dead

    with pytest.raises(Reject) as raised:
        run(_call(_delivery()), hooks, body)
    assert raised.value.requeue and raised.value.__cause__ is dead
    assert request.failed == []


def test_redis_out_of_reach_fails_no_request_and_passes_on_to_the_requeue() -> None:
    request = FakeRequest()
    _, _, hooks = _chain(request)
    for lost in (redis.ConnectionError("Connection refused"), redis.BusyLoadingError("loading")):

        def body(call: TaskCall[Any]) -> None:
            raise lost  # noqa: B023  # called at once, in this iteration

        with pytest.raises(type(lost)):
            run(_call(_delivery()), hooks, body)
    assert request.failed == []


def test_celerys_retry_is_not_a_failure() -> None:
    request = FakeRequest()
    _, _, hooks = _chain(request)

    def body(call: TaskCall[Any]) -> None:
        raise Retry("later")

    with pytest.raises(Retry):
        run(_call(_delivery()), hooks, body)
    assert request.failed == []


def test_cancellation_stops_the_body_where_it_checks_and_ends_the_request_as_cancelled() -> None:
    request = FakeRequest()
    _, cancellation, hooks = _chain(request)
    steps: list[int] = []

    def body(call: TaskCall[Any]) -> None:
        for step in range(5):
            cancellation.check(call)
            steps.append(step)
            if step == 1:
                request.cancel = True  # the client cancels meanwhile

    run(_call(_delivery()), hooks, body)
    assert steps == [0, 1] and request.ended_cancelled == 1 and request.failed == []


def test_a_body_may_raise_its_own_cancel() -> None:
    request = FakeRequest()
    _, _, hooks = _chain(request)

    class IngestStopped(TaskCancelled):
        pass

    def body(call: TaskCall[Any]) -> None:
        raise IngestStopped

    run(_call(_delivery()), hooks, body)
    assert request.ended_cancelled == 1 and request.failed == []


# -- RequestEvents ----------------------------------------------------------------------------


@dataclass
class FakeWriter:
    """What RequestEvents asks of an EventWriter."""

    cancelled: bool = False
    stage_ok: bool = True
    emitted: list[tuple[Any, str | None, float]] = field(default_factory=list)

    def start(self, stage: str) -> bool:
        return self.stage_ok

    def emit(self, event: Any, *, completes: str | None = None, service_s: float = 0.0) -> None:
        self.emitted.append((event, completes, service_s))


def test_a_request_failed_or_cancelled_through_its_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ragline.workers.hooks.time.time", lambda: 103.0)
    writer = FakeWriter()
    events = RequestEvents(writer, queue="generation", picked_at=100.0)  # type: ignore[arg-type]
    events.fail(Error(status=500, message="x"))
    events.end_cancelled()
    # A failure completes the task for the backpressure monitor; a cancel does not.
    assert writer.emitted == [(Error(status=500, message="x"), "generation", 3.0), (Cancelled(), None, 0.0)]
    assert events.start("generating") and not events.cancel_requested()
