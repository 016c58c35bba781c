"""bench/cpu_per_request.py: each process's CPU between two samples, per request answered."""

from __future__ import annotations

from bench.cpu_per_request import Sample, per_request


def test_cpu_per_request_and_busy_cores() -> None:
    before = Sample({"api": 1.0, "worker": 10.0, "redis": 0.5, "wrk": 0.0}, at=100.0)
    after = Sample({"api": 1.8, "worker": 14.0, "redis": 0.7, "wrk": 0.04}, at=102.0)
    got = per_request(before, after, requests=1000)
    assert got == {"api_ms": 0.8, "worker_ms": 4.0, "redis_ms": 0.2, "wrk_ms": 0.04, "busy": 2.52}


def test_no_request_answered_divides_by_one() -> None:
    s = Sample({"api": 0.0}, at=0.0)
    assert per_request(s, Sample({"api": 0.002}, at=1.0), requests=0) == {"api_ms": 2.0, "busy": 0.0}
