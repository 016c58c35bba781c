"""The thread that watches a running ingest job from beside it.

The job's own thread is busy reading, embedding or indexing, so another renews what the job
holds (its index lock and its turn's lease, every ``renew_every_s``: a third of their time to
live), and every ``poll_s`` looks for a cancel and for the job's time limit. Either one stops the
job: the watch kills the document reader (a parse cannot be interrupted in its thread) and the
job's thread stops at its next progress report (:meth:`Watch.stopped`), within seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Literal, Self

log = logging.getLogger(__name__)

StopReason = Literal["cancelled", "timed_out"]


class Watch:
    """Watches one job while it runs (a context manager: started on entry, joined on exit)."""

    def __init__(
        self,
        *,
        renew: Callable[[], None],
        cancelled: Callable[[], bool],
        on_stop: Callable[[], None],
        limit_s: float,
        renew_every_s: float,
        poll_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._renew = renew
        self._cancelled = cancelled
        self._on_stop = on_stop
        self.limit_s = limit_s
        self._renew_every_s = renew_every_s
        self._poll_s = poll_s
        self._clock = clock
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ingest-watch", daemon=True)
        self._deadline = 0.0
        self.reason: StopReason | None = None

    @property
    def stopped(self) -> bool:
        return self.reason is not None

    def __enter__(self) -> Self:
        self._deadline = self._clock() + self.limit_s
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        renewed = self._clock()
        while not self._done.wait(self._poll_s):
            now = self._clock()
            if now - renewed >= self._renew_every_s:
                renewed = now
                self._guarded("renew", self._renew)
            if self.reason is None:
                self.tick(now)

    def tick(self, now: float) -> None:
        """One look: stop the job when it was cancelled or its time is up."""
        if now >= self._deadline:
            self._stop("timed_out")
        elif self._guarded("look for a cancel", self._cancelled):
            self._stop("cancelled")

    def _stop(self, reason: StopReason) -> None:
        self.reason = reason
        log.info("ingest job stopping: %s", reason)
        self._guarded("stop the reader", self._on_stop)

    @staticmethod
    def _guarded(what: str, step: Callable[[], object]) -> bool:
        """Run ``step``; Redis away or a lock lost is logged, and the job goes on (its lock's TTL
        bounds what a lost renewal costs)."""
        try:
            return bool(step())
        except Exception:
            log.warning("ingest watch could not %s", what, exc_info=True)
            return False
