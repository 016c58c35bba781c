"""bench/overload.py's prediction error: admission's predicted wait against the latency seen."""

from __future__ import annotations

import math

import pytest

from bench.openloop import Sample, predicted_wait
from bench.overload import RunStats, prediction_errors


def _sample(latency: float, predicted: float, *, status: int = 200, degraded: bool = False) -> Sample:
    return Sample(0.0, 0.0, latency, status, 0, True, degraded, predicted)


def test_predicted_wait_is_read_from_the_answers_timings() -> None:
    assert predicted_wait({"timings": {"predicted_wait_ms": 1500.0}}) == pytest.approx(1.5)
    assert math.isnan(predicted_wait({"timings": {"predicted_wait_ms": None}}))
    assert math.isnan(predicted_wait({"timings": {}})) and math.isnan(predicted_wait({}))


def test_prediction_errors_are_relative_to_the_latency_of_full_answers_only() -> None:
    samples = [
        _sample(2.0, 1.0),  # predicted half of it: 0.5
        _sample(1.0, 1.25),  # 0.25
        _sample(4.0, 4.0),  # 0
        _sample(3.0, 0.1, degraded=True),  # not a full answer
        _sample(0.5, math.nan),  # no prediction (admission off)
        _sample(0.01, 0.5, status=503),  # refused
    ]
    assert prediction_errors(samples) == pytest.approx([0.5, 0.25, 0.0])
    run = RunStats("admission on", 1.0, samples, slo_s=5.0)
    assert run.predict_err(50) == pytest.approx(0.25)
    assert run.predict_err(90) == pytest.approx(0.5)
    row = run.row(duration_s=10.0)
    assert row.endswith("| 0.25 / 0.50 |")
    assert RunStats("admission off", 1.0, [_sample(1.0, math.nan)], 5.0).row(10.0).endswith("| - / - |")
