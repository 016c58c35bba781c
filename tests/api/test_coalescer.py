"""The coalescer's timing rules, on a real event loop with a recording publisher."""

from __future__ import annotations

import asyncio
import time

import pytest

from api.coalescer import Coalescer


class Recorder:
    def __init__(self) -> None:
        self.batches: list[tuple[float, list[int]]] = []

    async def __call__(self, items: list[dict]) -> None:
        self.batches.append((time.perf_counter(), [i["n"] for i in items]))


def test_lone_query_goes_at_once() -> None:
    async def scenario() -> float:
        rec = Recorder()
        c = Coalescer(rec, window_s=0.5, max_batch=64)
        started = time.perf_counter()
        await c.submit({"n": 1})
        return rec.batches[0][0] - started

    assert asyncio.run(scenario()) < 0.05


def test_concurrent_queries_share_a_batch_and_full_batch_closes_early() -> None:
    async def scenario() -> list[list[int]]:
        rec = Recorder()
        c = Coalescer(rec, window_s=10.0, max_batch=4)
        await c.submit({"n": 0})  # now one is in flight: later ones gather
        started = time.perf_counter()
        await asyncio.gather(*(c.submit({"n": n}) for n in range(1, 5)))
        assert time.perf_counter() - started < 1.0  # closed by size, not by the 10 s window
        return [b for _, b in rec.batches]

    assert asyncio.run(scenario()) == [[0], [1, 2, 3, 4]]


def test_window_bounds_the_wait() -> None:
    async def scenario() -> float:
        rec = Recorder()
        c = Coalescer(rec, window_s=0.02, max_batch=64)
        await c.submit({"n": 0})
        started = time.perf_counter()
        await c.submit({"n": 1})
        return time.perf_counter() - started

    assert 0.015 < asyncio.run(scenario()) < 0.2


def test_settle_reopens_the_fast_path_and_errors_propagate() -> None:
    async def failing(items: list[dict]) -> None:
        raise ConnectionError("broker down")

    async def scenario() -> None:
        c = Coalescer(failing, window_s=0.01, max_batch=8)
        with pytest.raises(ConnectionError):
            await c.submit({"n": 1})
        assert c.in_flight == 0

    asyncio.run(scenario())
