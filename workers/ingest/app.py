"""The ingest worker: ``celery -A ragline.workers.ingest.app:app worker -Q ingest -P solo``.

Runs the writes to indexes that arrive over HTTP (uploads, document and index deletes), each a
job, away from the retrieval workers: an ingest embeds for seconds to minutes, and queries go on
being answered from the current version meanwhile. The API queues each job under its API key and
sends a turn (``broker/state/ingest_turns.py``): a turn runs the next key's oldest job, so one
key's backlog cannot hold up another's upload. One ingest per index at a time (a lock in Redis):
a job whose index is locked goes back to the front of its key's list, and its turn is retried,
so each version is built on the one before it. It loads its own encoder, the same model as the
retrieval workers.

While a job runs, a watch thread (``watch.py``) renews its lock and lease, and stops it on a
cancel or past ``ingest_job_timeout_s``; each document is read in a child process
(``reading.py``) within ``ingest_document_timeout_s``, and one past it fails alone.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from pathlib import Path

import redis
from ragline.broker.config.settings import get_settings
from ragline.broker.contract.messages import IngestProgress, IngestResult, IngestTask, IngestTurn
from ragline.broker.contract.queues import INGEST_QUEUE, INGEST_TASK, INGEST_TURN_TASK
from ragline.broker.redis.durability import Replication
from ragline.broker.redis.pool import sync_client
from ragline.broker.state import jobs, shards
from ragline.broker.state.ingest_turns import Taken, Turns
from ragline.broker.streams.cancel import is_cancelled
from ragline.workers.bootstrap import bootstrap
from ragline.workers.hooked_task import hooked_task
from ragline.workers.hooks import Cancellation, DecodePayload, TrackJob
from ragline.workers.ingest import build
from ragline.workers.ingest.hooks import IndexLock, IngestJob, RemoveStaging
from ragline.workers.ingest.reading import ReaderProcess
from ragline.workers.ingest.watch import Watch
from ragline.workers.priority import lower_priority
from ragline.workers.retrieval.embedder import Embedder
from ragline.workers.task_call import Hook, RetryLater, TaskCall, TaskCancelled, run

log = logging.getLogger(__name__)
settings = get_settings()
ingest_settings = settings.ingest

# How soon an ingest that found its index locked by another one looks again.
_LOCKED_RETRY_S = 1.0
_embedder: Embedder | None = None


def embedder() -> Embedder:
    global _embedder
    if _embedder is None:
        _embedder = Embedder(settings.retrieval, device=settings.retrieval.ingest_encoder_device)
    return _embedder


_reader: ReaderProcess | None = None


def reader() -> ReaderProcess:
    """The child that reads documents (started at the first, again after a kill)."""
    global _reader
    if _reader is None:
        _reader = ReaderProcess(timeout_s=ingest_settings.ingest_document_timeout_s)
    return _reader


def turns() -> Turns:
    return Turns(sync_client(settings.redis), keys, lease_s=ingest_settings.ingest_lock_ttl_s)


def _yield_to_queries() -> None:
    """An ingest is batch work: where it shares cores with retrieval workers (``ragline up`` on
    one host), the scheduler gives queries the CPU first; on a host of its own this changes
    nothing. Its document reader goes lower still (reading.py)."""
    lower_priority(ingest_settings.ingest_niceness)


def _warm_up() -> None:
    embedder().encode(["warm up"])
    _sweep_staging(settings.uploads_dir, max_age_s=ingest_settings.upload_staging_ttl_s)


def _recover() -> None:
    """Jobs a dead worker was running go back in line, each with a turn of its own (the dead
    worker's turn comes back too, after the visibility timeout: a spare turn finds none)."""
    for _ in range(turns().recover()):
        app.send_task(
            INGEST_TURN_TASK, kwargs=IngestTurn(enqueued_at=time.time()).encode(), queue=INGEST_QUEUE
        )


def _close_reader() -> None:
    if _reader is not None:
        _reader.close()


worker = bootstrap(
    INGEST_QUEUE, settings, init=[_yield_to_queries, _warm_up], ready=[_recover], shutdown=[_close_reader]
)
app, keys = worker.app, worker.keys


def _sweep_staging(root: Path, *, max_age_s: float) -> None:
    """Uploads staged long ago and never ingested (their API died before enqueueing them)."""
    if not root.is_dir():
        return
    cutoff = time.time() - max_age_s
    for folder in root.iterdir():
        with contextlib.suppress(OSError):
            if folder.stat().st_mtime < cutoff:
                shutil.rmtree(folder, ignore_errors=True)


def _run(task: IngestTask, client: redis.Redis, report: build.Report) -> IngestResult:
    if task.operation == "delete_index":
        report(IngestProgress(phase="removing"))
        return build.remove(settings, client, keys, index=task.index, version=task.version)
    if task.operation == "add":
        assert task.staging is not None
        change = build.staged_chunks(
            settings.retrieval, settings.uploads_dir / task.staging, reader(), report
        )
    else:
        change = build.Change(add=[], added_ids=[], drop=frozenset(task.document_ids))
    shard_map = shards.lookup(client, keys, task.index)
    if shard_map is not None:
        result = build.change_shards(
            settings, client, keys, embedder(), shard_map=shard_map, change=change, report=report
        )
    else:
        result = build.next_version(
            settings, client, keys, embedder(), index=task.index, change=change, report=report
        )
    return result.model_copy(update={"failed": change.failed}) if change.failed else result


def _ingest_job(call: TaskCall[IngestTask]) -> IngestJob:
    client = sync_client(settings.redis)
    return IngestJob(
        jobs.JobTracker(
            client,
            keys,
            call.payload.job_id,
            job_ttl_s=settings.jobs.job_ttl_s,
            replication=Replication.of(settings.redis),
        ),
        stream_key=keys.events(call.payload.job_id),
        stream_ttl_s=settings.redis.event_stream_done_ttl_s,
        maxlen=settings.redis.event_stream_maxlen,
    )


index_lock = IndexLock(
    lambda: sync_client(settings.redis),
    keys,
    ttl_s=ingest_settings.ingest_lock_ttl_s,
    retry_s=_LOCKED_RETRY_S,
)
job = TrackJob("ingesting", _ingest_job, failed="ingest")
# build raises IngestCancelled (a TaskCancelled) once a progress report finds the job stopped.
_HOOKS: list[Hook[IngestTask]] = [index_lock, RemoveStaging(settings.uploads_dir), job, Cancellation(job)]
# Where a job run by a turn keeps what it took (its lease), in its TaskCall.
_TURN = "turn"


def _run_job(call: TaskCall[IngestTask]) -> None:
    """One write to an index (:class:`~ragline.broker.contract.messages.IngestTask`), a job of its
    own, watched while it runs."""
    tracked = job.tracked(call)
    client = sync_client(settings.redis)
    taken: Taken | None = call.get(_TURN) if call.has(_TURN) else None
    lease = turns() if taken is not None else None
    documents = reader()
    documents.rearm()

    def renew() -> None:
        index_lock.renew(call)
        if lease is not None and taken is not None:
            lease.renew(taken)

    watch = Watch(
        renew=renew,
        cancelled=lambda: is_cancelled(client, keys, call.payload.job_id),
        on_stop=documents.stop,
        limit_s=ingest_settings.ingest_job_timeout_s,
        renew_every_s=ingest_settings.ingest_lock_ttl_s / 3,
    )

    def report(progress: IngestProgress) -> bool:
        return not watch.stopped and tracked.progress(progress)

    with watch:
        try:
            result = _run(call.payload, client, report)
        except TaskCancelled:
            if watch.reason == "timed_out":
                raise build.IngestRefused(
                    504,
                    f"the job ran past its time limit of {watch.limit_s:g} s (RAGLINE_INGEST_JOB_TIMEOUT_S)",
                ) from None
            raise
    tracked.finish(result)


# A task sent by an earlier release: its job, as sent.
ingest = hooked_task(app, INGEST_TASK, IngestTask, _HOOKS, max_retries=None)(_run_job)


def _take_turn(call: TaskCall[IngestTurn]) -> None:
    """One turn: the oldest job of the next API key with work, or nothing when none waits."""
    line = turns()
    line.recover()
    taken = line.take()
    if taken is None:
        return
    inner: TaskCall[IngestTask] = TaskCall(
        INGEST_TASK, taken.queued.task.encode(), task_id=call.task_id, headers=call.headers
    )
    inner.put(_TURN, taken)
    try:
        run(inner, [DecodePayload(IngestTask), *_HOOKS], _run_job)
    except RetryLater:
        line.give_back(taken)  # its index is locked: it keeps its place, the turn comes again
        raise
    # Not on another error: its lease ends and the job runs again (a job already final is skipped).
    line.finish(taken)


ingest_turn = hooked_task(app, INGEST_TURN_TASK, IngestTurn, [], max_retries=None)(_take_turn)
