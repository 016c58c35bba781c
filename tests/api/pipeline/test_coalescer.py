"""The coalescer's timing rules with a recording publisher, on an event loop with a virtual
clock (tests/virtual_clock.py): time moves only from one timer to the next, so when a batch
leaves is exact, and a busy machine cannot make a rule look broken."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from ragline.api.pipeline.coalescer import Coalescer

from tests import virtual_clock


@dataclass(frozen=True)
class Item:
    request_id: str


class Recorder:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.times: list[float] = []

    async def __call__(self, items: list[Item]) -> None:
        self.batches.append([i.request_id for i in items])
        self.times.append(_now())


def _item(n: int) -> Item:
    return Item(f"r{n}")


def _now() -> float:
    return asyncio.get_running_loop().time()


def test_lone_query_goes_at_once() -> None:
    async def scenario() -> float:
        rec = Recorder()
        c = Coalescer(rec, window_s=0.5, max_batch=64)
        started = _now()
        await c.submit(_item(1))
        return rec.times[0] - started

    assert virtual_clock.run(scenario()) == 0  # no window: nothing else was in play


def test_concurrent_queries_share_a_batch_and_full_batch_closes_early() -> None:
    async def scenario() -> list[list[str]]:
        rec = Recorder()
        c = Coalescer(rec, window_s=10.0, max_batch=4)
        await c.submit(_item(0))  # one batch in flight: later ones gather
        started = _now()
        await asyncio.gather(*(c.submit(_item(n)) for n in range(1, 5)))
        assert rec.times[1] == started  # closed by size as the fourth came, not by the 10 s window
        return rec.batches

    assert virtual_clock.run(scenario()) == [["r0"], ["r1", "r2", "r3", "r4"]]


def test_window_bounds_the_wait_when_a_worker_is_free() -> None:
    async def scenario() -> float:
        rec = Recorder()
        c = Coalescer(rec, window_s=0.02, max_batch=64, max_in_flight=lambda: 2)
        await c.submit(_item(0))
        started = _now()
        await c.submit(_item(1))
        return _now() - started

    assert virtual_clock.run(scenario()) == pytest.approx(0.02)  # one window, not a hold


def test_busy_workers_hold_the_batch_until_one_comes_back() -> None:
    async def scenario() -> list[list[str]]:
        rec = Recorder()
        c = Coalescer(rec, window_s=0.01, max_batch=64, max_in_flight=lambda: 1)
        await c.submit(_item(0))
        waiting = [asyncio.create_task(c.submit(_item(n))) for n in range(1, 4)]
        await asyncio.sleep(0.05)  # the window closed, but the only worker is busy
        assert rec.batches == [["r0"]]
        c.settle("r0")  # its batch came back: the held queries go together, at once
        settled = _now()
        await asyncio.gather(*waiting)
        assert rec.times[1] == settled
        return rec.batches

    assert virtual_clock.run(scenario()) == [["r0"], ["r1", "r2", "r3"]]


def test_a_batch_that_never_comes_back_holds_the_next_no_longer_than_the_shortest_hold() -> None:
    """Its worker died: the held queries go when the hold runs out (20 windows), not never."""

    async def scenario() -> float:
        rec = Recorder()
        c = Coalescer(rec, window_s=0.01, max_batch=64, max_in_flight=lambda: 1)
        await c.submit(_item(0))  # never settled
        started = _now()
        await c.submit(_item(1))
        return _now() - started

    # The first window closes, then the hold counts from there.
    assert virtual_clock.run(scenario()) == pytest.approx(0.01 + 20 * 0.01)


def test_a_hold_lasts_as_long_as_batches_take_to_come_back() -> None:
    async def scenario() -> list[list[str]]:
        rec = Recorder()
        c = Coalescer(rec, window_s=0.01, max_batch=64, max_in_flight=lambda: 1)  # shortest hold 0.2 s
        await c.submit(_item(0))
        await asyncio.sleep(0.3)
        c.settle("r0")  # batches take 0.3 s: hold up to 0.6 s rather than split the next ones
        await c.submit(_item(1))
        held = asyncio.create_task(c.submit(_item(2)))
        await asyncio.sleep(0.35)
        assert rec.batches == [["r0"], ["r1"]]
        c.settle("r1")
        await held
        return rec.batches

    assert virtual_clock.run(scenario()) == [["r0"], ["r1"], ["r2"]]


def test_publish_errors_propagate_and_free_the_slot() -> None:
    async def failing(items: list[Item]) -> None:
        raise ConnectionError("broker down")

    async def scenario() -> None:
        c = Coalescer(failing, window_s=0.01, max_batch=8)
        with pytest.raises(ConnectionError):
            await c.submit(_item(1))
        assert c.batches_in_flight == 0

    virtual_clock.run(scenario())


def test_a_batch_is_a_share_of_the_queries_in_play() -> None:
    """With one worker, half of them: one batch computes while the other turns around."""

    async def scenario() -> list[list[str]]:
        rec = Recorder()
        c = Coalescer(rec, window_s=0.01, max_batch=64, max_in_flight=lambda: 1, min_split=2)
        await c.submit(_item(0))
        held = [asyncio.create_task(c.submit(_item(n))) for n in range(1, 9)]
        await asyncio.sleep(0.05)
        c.settle("r0")  # eight in play: the next batch takes four, four wait for it to come back
        await asyncio.sleep(0.05)
        assert rec.batches[1:] == [["r1", "r2", "r3", "r4"]]
        c.settle("r1")
        await asyncio.gather(*held)
        return rec.batches

    assert virtual_clock.run(scenario())[2:] == [["r5", "r6", "r7", "r8"]]


def test_after_a_batch_of_several_the_next_queries_gather_for_a_window() -> None:
    async def scenario() -> tuple[list[list[str]], float]:
        rec = Recorder()
        c = Coalescer(rec, window_s=0.05, max_batch=64, max_in_flight=lambda: 1, min_split=2)
        await c.submit(_item(0))
        held = [asyncio.create_task(c.submit(_item(n))) for n in (1, 2)]
        await asyncio.sleep(0.01)
        c.settle("r0")
        await asyncio.gather(*held)  # r1 and r2 went together
        c.settle("r1")  # their batch is back; r2's answer is still being written
        nxt = asyncio.create_task(c.submit(_item(3)))
        await asyncio.sleep(0.01)
        assert len(rec.batches) == 2  # r3 waits: r2's client is likely about to ask too
        c.settle("r2")
        drained = _now()
        later = asyncio.create_task(c.submit(_item(4)))
        await asyncio.gather(nxt, later)
        return rec.batches, rec.times[-1] - drained

    batches, waited = virtual_clock.run(scenario())
    assert batches[2] == ["r3", "r4"]
    # A window after the last answer went out, and no more than the next window's timer later.
    assert 0.05 <= waited <= 2 * 0.05


def test_the_publisher_is_called_when_the_batch_is_taken() -> None:
    """Not later in a task: a publisher that writes in the call gets its write out first."""
    calls: list[list[str]] = []

    def publish(items: list[Item]) -> asyncio.Future[None]:
        calls.append([i.request_id for i in items])
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def scenario() -> None:
        c = Coalescer(publish, window_s=0.01, max_batch=64, max_in_flight=lambda: 1)
        await c.submit(_item(0))
        held = asyncio.create_task(c.submit(_item(1)))
        await asyncio.sleep(0.05)
        c.settle("r0")
        assert calls == [["r0"], ["r1"]]  # before this coroutine yields to the loop
        await held

    virtual_clock.run(scenario())
