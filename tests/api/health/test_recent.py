"""What the open paths read from Redis, computed at most once per interval whoever asks."""

from __future__ import annotations

import asyncio

import pytest
from ragline.api.health.recent import Recent


def test_concurrent_and_repeated_callers_share_one_computation() -> None:
    calls = 0

    async def compute() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        return calls

    async def scenario() -> None:
        recent = Recent(compute, max_age_s=0.2)
        assert await asyncio.gather(*(recent.get() for _ in range(50))) == [1] * 50
        assert await recent.get() == 1 and calls == 1
        await asyncio.sleep(0.25)
        assert await recent.get() == 2

    asyncio.run(scenario())


def test_a_failed_computation_is_tried_again_by_the_next_caller() -> None:
    outcomes = [RuntimeError("redis"), 7]

    async def compute() -> int:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def scenario() -> None:
        recent = Recent(compute, max_age_s=60)
        with pytest.raises(RuntimeError):
            await recent.get()
        assert await recent.get() == 7

    asyncio.run(scenario())
