"""An attempt's outcome is written again while Redis is away, within the attempt's lease only."""

from __future__ import annotations

import time

import pytest
import redis
from ragline.workers.callbacks import _within_lease


def test_an_outcome_is_recorded_once_redis_answers_again() -> None:
    replies: list[object] = [redis.ConnectionError("restarting"), redis.TimeoutError("slow"), "delivered"]

    def write() -> str:
        reply = replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return str(reply)

    assert _within_lease(write, time.monotonic() + 10) == "delivered"
    assert replies == []


def test_past_the_lease_the_error_is_raised() -> None:
    calls = 0

    def write() -> str:
        nonlocal calls
        calls += 1
        raise redis.ConnectionError("down")

    with pytest.raises(redis.ConnectionError):
        _within_lease(write, time.monotonic() + 0.25)
    assert 1 < calls < 6


def test_other_errors_are_not_retried() -> None:
    def write() -> str:
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        _within_lease(write, time.monotonic() + 10)
