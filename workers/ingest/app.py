"""The ingest worker: ``celery -A workers.ingest.app:app worker -Q ingest -P solo``.

Runs the writes to indexes that arrive over HTTP (uploads, document and index deletes), each a
job, away from the retrieval workers: an ingest embeds for seconds to minutes, and queries go on
being answered from the current version meanwhile. One ingest per index at a time (a lock in
Redis, renewed as it progresses): a second one waits its turn in the queue, so each version is
built on the one before it. It loads its own encoder, the same model as the retrieval workers.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import redis
from celery import Task
from celery.signals import worker_init

from broker import jobs, shards
from broker.celery_app import create_celery
from broker.contract import Error, IngestProgress, IngestResult, IngestTask
from broker.keys import Keys
from broker.queues import INGEST_QUEUE, INGEST_TASK
from broker.redis_pool import sync_client
from broker.settings import get_settings
from workers import heartbeat, metrics_server
from workers.ingest import build
from workers.retrieval.embedder import Embedder

log = logging.getLogger(__name__)
settings = get_settings()
ingest_settings = settings.ingest
keys = Keys(settings.redis.key_prefix)
app = create_celery(settings.redis)
metrics_server.install(settings.redis)
heartbeat.install(app, INGEST_QUEUE, settings.redis, host_defaults=settings.host_defaults_line())

# How soon an ingest that found its index locked by another one looks again.
_LOCKED_RETRY_S = 1.0
_embedder: Embedder | None = None


def embedder() -> Embedder:
    global _embedder
    if _embedder is None:
        _embedder = Embedder(settings.retrieval)
    return _embedder


@worker_init.connect(weak=False)
def _warm_up(**_: object) -> None:
    embedder().encode(["warm up"])
    _sweep_staging(settings.uploads_dir, max_age_s=ingest_settings.upload_staging_ttl_s)


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
        report(IngestProgress(phase="reading"))
        change = build.staged_chunks(settings.retrieval, settings.uploads_dir / task.staging)
    else:
        change = build.Change(add=[], added_ids=[], drop=frozenset(task.document_ids))
    shard_map = shards.lookup(client, keys, task.index)
    if shard_map is not None:
        return build.change_shards(
            settings, client, keys, embedder(), shard_map=shard_map, change=change, report=report
        )
    return build.next_version(
        settings, client, keys, embedder(), index=task.index, change=change, report=report
    )


@app.task(name=INGEST_TASK, bind=True, max_retries=None)
def ingest(self: Task, **kwargs: Any) -> None:
    """One write to an index (:class:`~broker.contract.IngestTask`), a job of its own."""
    try:
        task = IngestTask.decode(kwargs)
    except Exception as exc:
        # Acknowledged and dropped: a redelivery would fail the same way.
        log.error("rejected %s task %s: %s", INGEST_TASK, self.request.id, exc)
        return
    client = sync_client(settings.redis)
    tracker = jobs.JobTracker(client, keys, task.job_id, job_ttl_s=settings.jobs.job_ttl_s)
    lock = client.lock(
        keys.ingest_lock(task.index),
        timeout=ingest_settings.ingest_lock_ttl_s,
        blocking=False,
        thread_local=False,
    )
    if not lock.acquire():
        # Another ingest of this index is running: this one waits its turn, still queued.
        raise self.retry(countdown=_LOCKED_RETRY_S)

    def report(progress: IngestProgress) -> bool:
        lock.reacquire()  # still ours, for another ingest_lock_ttl_s
        return tracker.progress(progress)

    outcome: IngestResult | Error | None = None
    try:
        # False: cancelled before it started, or finished already (this is a redelivery).
        if tracker.start("ingesting"):
            outcome = _run(task, client, report)
    except build.IngestCancelled:
        outcome = None  # the cancel wrote the job's end already
    except build.IngestRefused as exc:
        outcome = Error(status=exc.status, message=str(exc))
    except Exception as exc:
        log.exception("ingest job %s of index %s failed", task.job_id, task.index)
        outcome = Error(status=500, message=f"ingest failed: {exc}")
    finally:
        with contextlib.suppress(Exception):
            lock.release()
    if outcome is not None:
        tracker.finish_ingest(
            keys.events(task.job_id),
            outcome,
            stream_ttl_s=settings.redis.event_stream_done_ttl_s,
            maxlen=settings.redis.event_stream_maxlen,
        )
    if task.staging:
        shutil.rmtree(settings.uploads_dir / task.staging, ignore_errors=True)
