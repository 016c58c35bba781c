"""What an ingest task does around its body (``workers/task_call.py``): one ingest per index at
a time, the staged upload removed once the task ran, and the job record as the ingest drives it."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from pathlib import Path

import redis
from ragline.broker.contract.messages import Error, IngestProgress, IngestResult, IngestTask
from ragline.broker.redis.keys import Keys
from ragline.broker.state.jobs import JobTracker
from ragline.workers.task_call import Hook, RetryLater, TaskCall
from redis.lock import Lock


class IndexLock(Hook[IngestTask]):
    """One ingest per index at a time, so each version is built on the one before it: a lock in
    Redis, held for ``ttl_s`` and renewed as the ingest progresses (:meth:`renew`). An ingest
    that finds it taken waits its turn, still queued: Celery retries it in ``retry_s``."""

    def __init__(
        self, client: Callable[[], redis.Redis], keys: Keys, *, ttl_s: float, retry_s: float
    ) -> None:
        self.client = client
        self.keys = keys
        self.ttl_s = ttl_s
        self.retry_s = retry_s

    def before(self, call: TaskCall[IngestTask]) -> None:
        lock = self.client().lock(
            self.keys.ingest_lock(call.payload.index), timeout=self.ttl_s, blocking=False, thread_local=False
        )
        if not lock.acquire():
            raise RetryLater(self.retry_s)
        call.put(self, lock)

    def renew(self, call: TaskCall[IngestTask]) -> None:
        """Still ours, for another ``ttl_s``."""
        lock: Lock = call.get(self)
        lock.reacquire()

    def after(self, call: TaskCall[IngestTask], error: BaseException | None) -> BaseException | None:
        lock: Lock = call.get(self)
        with contextlib.suppress(Exception):  # expired, or Redis away: its TTL frees it
            lock.release()
        return error


class RemoveStaging(Hook[IngestTask]):
    """The upload staged under ``root`` goes once its task ran, however it ended (not while it
    waits its turn: listed after :class:`IndexLock`)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def after(self, call: TaskCall[IngestTask], error: BaseException | None) -> BaseException | None:
        if call.payload.staging:
            shutil.rmtree(self.root / call.payload.staging, ignore_errors=True)
        return error


class IngestJob:
    """An ingest job as its task drives it (``hooks.Tracked``): progress, then its result or its
    error as the job's end and the last event of its stream. A cancel is seen where a progress
    report finds the job final; the cancel wrote the job's end already."""

    def __init__(self, tracker: JobTracker, *, stream_key: str, stream_ttl_s: int, maxlen: int) -> None:
        self.tracker = tracker
        self.stream_key = stream_key
        self.stream_ttl_s = stream_ttl_s
        self.maxlen = maxlen
        self._cancelled = False

    def start(self, stage: str) -> bool:
        return self.tracker.start(stage)

    def progress(self, progress: IngestProgress) -> bool:
        """False once the job is final (cancelled, say): the ingest stops."""
        self._cancelled = not self.tracker.progress(progress)
        return not self._cancelled

    def finish(self, outcome: IngestResult | Error) -> None:
        self.tracker.finish_ingest(
            self.stream_key, outcome, stream_ttl_s=self.stream_ttl_s, maxlen=self.maxlen
        )

    def fail(self, error: Error) -> None:
        self.finish(error)

    def cancel_requested(self) -> bool:
        return self._cancelled

    def end_cancelled(self) -> None:
        pass
