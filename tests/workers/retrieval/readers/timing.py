"""Whether reading grows linearly with the input: timed so that a noisy, shared box does not decide.

A reader of 10× the input may take at most RATIO_BOUND times as long (linear is 10×, quadratic
100×). The small input is read ten times as often as the large one, the two taken in turns and
each the best of its turns, so that both timings cover the same amount of text for about as long;
each lasts MIN_TIMING_S at least. A verdict against linear time waits for up to ROUNDS rounds of
three turns.

Time is this process's CPU time (``time.process_time``), not the wall clock's
(``time.perf_counter``): on a box whose two cores are shared with other work, a linear reader's
wall-clock ratio still swung past the bound now and then, even as the best of many turns, while
its CPU-time ratio held steady. A reader does no I/O worth timing but reading its file, so CPU
time is what it costs.
"""

from __future__ import annotations

import gc
import math
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

SCALE = 10
RATIO_BOUND = 15
ROUNDS = 5
MIN_TIMING_S = 0.02


class _TooSlow(Exception):
    pass


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Interrupt the block after ``seconds`` on the wall clock (the regex engine checks for signals
    as it runs), so that a quadratic reader fails in seconds, not minutes. Not a CPU-time timer:
    while one is armed, Linux samples the process's CPU time at scheduler ticks, and
    ``process_time`` then reads 0 for a read under a millisecond."""

    def interrupt(signum: int, frame: object) -> None:
        raise _TooSlow

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _time(read: Callable[[], object], times: int, limit_s: float) -> tuple[float, float]:
    """The CPU time and the wall-clock time of ``times`` reads."""
    with _deadline(limit_s):
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(times):
            read()
        return time.process_time() - cpu, time.perf_counter() - wall


def assert_linear_time(read_small: Callable[[], object], read_large: Callable[[], object]) -> None:
    """``read_large``, on SCALE times the input of ``read_small``, takes at most RATIO_BOUND times
    as long."""
    gc.disable()  # a collection landing in one run would weigh more than the reading itself
    try:
        _time(read_small, 1, limit_s=60)  # its first run warms caches up
        # By the wall clock: the CPU timer moves by scheduler ticks, so one short read often read
        # as 0 and every input got the same 100 repeats: a few milliseconds for the smallest, whose
        # ratio then wandered past the bound.
        _, once = _time(read_small, 1, limit_s=60)
        repeats = min(10_000, max(1, math.ceil(MIN_TIMING_S / (SCALE * max(once, 1e-6)))))
        smalls = large = math.inf  # read_small run SCALE * repeats times, read_large repeats times
        for _ in range(ROUNDS):
            for _ in range(3):
                turn, turn_wall = _time(read_small, SCALE * repeats, limit_s=60)
                smalls = min(smalls, turn)
                # From this turn's wall clock: a box busy enough to slow it slows the large one too.
                limit = max(1.0, 2 * RATIO_BOUND * turn_wall / SCALE)
                try:
                    large = min(large, _time(read_large, repeats, limit_s=limit)[0])
                except _TooSlow:
                    pytest.fail(f"the large input took over {limit:.1f} s; the small one {once:.4f} s")
            if large <= RATIO_BOUND * smalls / SCALE:
                return
    finally:
        gc.enable()
    ratio = large * SCALE / smalls
    pytest.fail(f"{SCALE}× the input took {ratio:.1f}× the time (at most {RATIO_BOUND}×)")
