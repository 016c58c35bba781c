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


def test_done_counts_sum_every_concurrency_bucket(redis_url: str) -> None:
    """The server-side count the report prints: completions recorded in any bucket."""
    import uuid

    import redis
    from ragline.broker.config.settings import Settings
    from ragline.broker.contract.queues import GENERATION_QUEUE, RETRIEVAL_QUEUE
    from ragline.broker.limits.backpressure import count_done
    from ragline.broker.redis.keys import Keys

    from bench.overload import done_counts

    prefix = f"test-overload-{uuid.uuid4().hex[:8]}"
    settings = Settings().replace(redis_url=redis_url, key_prefix=prefix)
    client, keys = redis.Redis.from_url(redis_url), Keys(prefix)
    pipe = client.pipeline()
    count_done(pipe, keys, RETRIEVAL_QUEUE, 3, 0.1, concurrency=1.0)
    count_done(pipe, keys, RETRIEVAL_QUEUE, 5, 0.2, concurrency=4.0, slots=8)
    count_done(pipe, keys, GENERATION_QUEUE, 1, 1.0)
    pipe.execute()
    try:
        assert done_counts(settings) == {RETRIEVAL_QUEUE: 8, GENERATION_QUEUE: 1}
    finally:
        client.delete(keys.done(RETRIEVAL_QUEUE), keys.done(GENERATION_QUEUE))
