"""An asyncio event loop on a virtual clock, for tests of timing rules without a stopwatch.

The loop's ``time()`` stands still while anything is ready to run; when nothing is, it jumps to
the next timer instead of sleeping. ``asyncio.sleep``, ``call_later`` and ``asyncio.timeout`` keep
their meaning, a test takes no wall-clock time, and the times it reads are exact: "the batch
left one window after the query" is ``== window``, whatever the machine's load. Only for code
that waits on nothing but the loop's own timers (no sockets, threads or subprocesses: their
events would arrive at whatever virtual time the loop has jumped to).
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


# How long, in real time, the loop may wait for a thread's wake-up when no timer is set (a
# default executor's shutdown); then it is a deadlock, which a real clock would wait out for ever.
_REAL_WAIT_S = 5.0


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualClockLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or (timeout is not None and timeout <= 0):
            return ready
        if timeout is None:
            ready = super().select(_REAL_WAIT_S)
            if not ready:
                raise RuntimeError("deadlock: every task waits, and no timer is set")
            return ready
        self._loop.advance(timeout)  # nothing to do until the next timer: be there at once
        return ready


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a virtual clock that starts at 0."""
    with asyncio.Runner(loop_factory=VirtualClockLoop) as runner:
        return runner.run(main)
