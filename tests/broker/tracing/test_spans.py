"""Step spans and spans of measured intervals: made only while tracing is on."""

from __future__ import annotations

import asyncio
import time

import pytest
from ragline.broker import tracing
from ragline.broker.tracing import propagation

from tests.traced import named, recording


class Steps:
    def __init__(self) -> None:
        self.calls = 0

    @tracing.traced("step", lambda self, n, **_: {"n": n, "calls": self.calls})
    async def step(self, n: int, *, fail: bool = False) -> int:
        self.calls += 1
        if fail:
            raise ValueError("no")
        return n * 2


def test_a_traced_step_off_runs_as_it_is() -> None:
    assert not tracing.active()
    steps = Steps()
    assert asyncio.run(steps.step(2)) == 4
    assert steps.calls == 1


def test_a_traced_step_is_a_span_current_while_it_runs_with_what_it_says() -> None:
    with recording() as spans:
        tracer = tracing.tracer()
        assert tracer is not None
        with tracer.start_as_current_span("request") as request:
            assert asyncio.run(Steps().step(3)) == 6
        (step,) = named(spans.get_finished_spans(), "step")
        assert step.parent is not None and step.parent.span_id == request.get_span_context().span_id
        assert dict(step.attributes or {}) == {"n": 3, "calls": 1}


def test_a_step_that_raises_is_a_failed_span_and_the_error_goes_on() -> None:
    with recording() as spans:
        with pytest.raises(ValueError):
            asyncio.run(Steps().step(1, fail=True))
        (step,) = spans.get_finished_spans()
        assert not step.status.is_ok
        assert [e.name for e in step.events] == ["exception"]
        assert dict(step.attributes or {}) == {"n": 1, "calls": 1}  # described all the same


def test_a_measured_interval_is_a_span_at_its_own_times() -> None:
    with recording() as spans:
        started = time.perf_counter()
        before_ns = time.time_ns()
        tracing.record_perf("embed", started, started + 0.25, {"texts": 4})
        (embed,) = spans.get_finished_spans()
        assert embed.start_time is not None and embed.end_time is not None
        assert abs(embed.start_time - before_ns) < 50_000_000  # the clocks agree to a few ms
        assert embed.end_time - embed.start_time == pytest.approx(250_000_000, abs=1000)
        assert dict(embed.attributes or {}) == {"texts": 4}


def test_off_nothing_is_recorded_or_kept() -> None:
    tracing.record("x", 1, 2)
    tracing.record_perf("x", 1.0, 2.0)
    propagation.remember("r1")
    assert propagation.batch_headers(["r1"]) is None
