"""The watch beside a running ingest job (watch.py): it renews what the job holds, and stops the
job on a cancel or at its time limit, killing the reader; Redis errors do not stop the job.
Narrow fakes for the lock, the cancel flag and the reader: what is tested is the thread's logic."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from ragline.workers.ingest.watch import Watch


@dataclass
class Held:
    """What the watch acts on: counts renewals and stops, answers the cancel flag."""

    cancel: bool = False
    renewals: int = 0
    stops: int = 0
    failing: bool = False
    stopped: threading.Event = field(default_factory=threading.Event)

    def renew(self) -> None:
        self.renewals += 1
        if self.failing:
            raise ConnectionError("redis away")

    def cancelled(self) -> bool:
        if self.failing:
            raise ConnectionError("redis away")
        return self.cancel

    def stop(self) -> None:
        self.stops += 1
        self.stopped.set()


def _watch(held: Held, *, limit_s: float = 60, renew_every_s: float = 0.05, poll_s: float = 0.01) -> Watch:
    return Watch(
        renew=held.renew,
        cancelled=held.cancelled,
        on_stop=held.stop,
        limit_s=limit_s,
        renew_every_s=renew_every_s,
        poll_s=poll_s,
    )


def test_it_renews_while_the_job_runs_and_stops_nothing() -> None:
    held = Held()
    with _watch(held) as watch:
        time.sleep(0.3)
    assert held.renewals >= 3 and held.stops == 0 and not watch.stopped


def test_a_cancel_stops_the_job_and_kills_the_reader_once() -> None:
    held = Held()
    with _watch(held) as watch:
        held.cancel = True
        assert held.stopped.wait(2)
        time.sleep(0.05)
    assert watch.reason == "cancelled" and held.stops == 1


def test_the_job_limit_stops_it_with_its_own_reason() -> None:
    held = Held()
    began = time.monotonic()
    with _watch(held, limit_s=0.2) as watch:
        assert held.stopped.wait(2)
    assert watch.reason == "timed_out" and held.stops == 1
    assert 0.2 <= time.monotonic() - began < 1.5


def test_the_limit_wins_over_a_cancel_seen_at_the_same_look() -> None:
    clock = [0.0]
    held = Held(cancel=True)
    watch = Watch(
        renew=held.renew,
        cancelled=held.cancelled,
        on_stop=held.stop,
        limit_s=10,
        renew_every_s=1,
        clock=lambda: clock[0],
    )
    watch._deadline = 10.0  # as __enter__ sets it at clock 0, without the thread
    watch.tick(10.0)
    assert watch.reason == "timed_out"


def test_redis_away_is_logged_and_the_job_goes_on() -> None:
    held = Held(failing=True)
    with _watch(held) as watch:
        time.sleep(0.2)
    assert held.renewals >= 2 and not watch.stopped and held.stops == 0
