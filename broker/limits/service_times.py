"""What one task of a queue takes in its worker, learnt per concurrency level.

A batching engine serves a request in a time that depends on how many it batches with: on a CPU,
4 at once took each about twice as long as one alone, and a GPU engine's step barely grows from 1
to 64. One time for every level, or one straight line through all of them, is pulled towards
whatever level most recent tasks ran at: after a phase of lone requests, a line through them
predicted a batch of 4 far too quick, and the other way round. So the tasks are kept apart by the
concurrency they ran at (the tasks running at once in their worker, on average over the task,
itself included), in buckets 1, 2-4, 5-16, 17-64, 65-256 and above: each bucket holds its recent
tasks' sums (count, requests, concurrency, seconds), each task's weight falling by ``KEEP`` per
later task of the same bucket, so a level's time is that of its last few tasks and follows a
change of load (a retrieval load beside generation slows it) within a few tasks, while a level
not run lately keeps what it last measured.

``backpressure.lua`` keeps these sums in Redis (:func:`count_done` in backpressure.py writes a
finished task's counters there); :meth:`ServiceTimes.fold` does the same arithmetic in Python, for
replaying a recorded trace (tests/broker/limits/test_prediction_trace.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# The top concurrency of each bucket but the last (which holds everything above 256).
BUCKET_TOPS = (1, 4, 16, 64, 256)
BUCKETS = len(BUCKET_TOPS) + 1
# Each earlier task of a bucket weighs this much less per later task of that bucket: about the
# last ten tasks of a level count. backpressure.lua uses the same figure.
KEEP = 0.9


def bucket(concurrency: float) -> int:
    """The bucket of a task that ran at ``concurrency`` (rounded to whole tasks)."""
    c = round(concurrency)
    for k, top in enumerate(BUCKET_TOPS):
        if c <= top:
            return k
    return len(BUCKET_TOPS)


@dataclass(frozen=True, slots=True)
class Level:
    """Recency-weighted sums over one bucket's recent tasks."""

    n: float = 0.0  # tasks
    requests: float = 0.0
    c: float = 0.0  # concurrency
    s: float = 0.0  # seconds

    def add(self, weight_kept: float, n: float, requests: float, c: float, s: float) -> Level:
        k = weight_kept
        return Level(self.n * k + n, self.requests * k + requests, self.c * k + c, self.s * k + s)


@dataclass(frozen=True, slots=True)
class ServiceTimes:
    """A queue's recent tasks, per concurrency bucket (see the module docstring)."""

    levels: tuple[Level, ...] = (Level(),) * BUCKETS

    @classmethod
    def of(cls, *tasks: tuple[float, float], requests_per_task: float = 1.0) -> ServiceTimes:
        """Equal-weight sums of (seconds, concurrency) pairs (for hand-made snapshots)."""
        levels = list(cls().levels)
        for seconds, concurrency in tasks:
            k = bucket(concurrency)
            levels[k] = levels[k].add(1.0, 1, requests_per_task, concurrency, seconds)
        return cls(tuple(levels))

    def fold(self, tasks: Iterable[tuple[float, float, float]]) -> ServiceTimes:
        """These sums with tasks of (requests, seconds, concurrency) finished since, as
        ``backpressure.lua`` folds them at a refresh."""
        added: dict[int, list[float]] = {}
        for requests, seconds, concurrency in tasks:
            sums = added.setdefault(bucket(concurrency), [0.0, 0.0, 0.0, 0.0])
            for i, x in enumerate((1.0, requests, concurrency, seconds)):
                sums[i] += x
        levels = list(self.levels)
        for k, (n, requests, c, s) in added.items():
            levels[k] = levels[k].add(KEEP**n, n, requests, c, s)
        return ServiceTimes(tuple(levels))

    @property
    def n(self) -> float:
        return sum(level.n for level in self.levels)

    @property
    def requests_per_task(self) -> float:
        requests = sum(level.requests for level in self.levels)
        return requests / self.n if self.n > 0 and requests > 0 else 1.0

    def points(self) -> list[tuple[float, float, float]]:
        """(mean concurrency, mean seconds, weighted tasks) of each bucket that has tasks, by
        concurrency."""
        return [(max(1.0, lv.c / lv.n), lv.s / lv.n, lv.n) for lv in self.levels if lv.n > 0]

    def at(self, concurrency: float) -> float:
        """A task's seconds when ``concurrency`` tasks run at once in its worker.

        Between two measured levels: on the line between their means. Below the lowest measured
        level the time is taken proportional to the concurrency (an engine of fixed throughput).
        Above the highest, the line through the two highest goes on, its slope between flat
        (company costs nothing) and proportional; with one level measured, flat. Each guess errs
        towards admitting, and an admitted task is a measurement at the level it runs at;
        guessing high instead refuses the very requests that would correct it. Flat from the
        highest level alone admitted, on a CPU engine, bursts well above the highest level
        measured, each of which then took far longer than predicted.
        """
        points = self.points()
        if not points:
            return 0.0
        c = max(1.0, concurrency)
        low_c, low_s, _ = points[0]
        if c <= low_c:
            return low_s * c / low_c
        for high_c, high_s, _ in points[1:]:
            if c <= high_c:
                return low_s + (high_s - low_s) * (c - low_c) / (high_c - low_c)
            low_c, low_s = high_c, high_s
        if len(points) < 2:
            return low_s
        (below_c, below_s, _), (top_c, top_s, _) = points[-2], points[-1]
        slope = min(max((top_s - below_s) / (top_c - below_c), 0.0), top_s / top_c)
        return top_s + slope * (c - top_c)
