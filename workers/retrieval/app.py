"""The retrieval worker: ``celery -A workers.retrieval.app:app worker -Q retrieval``."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from celery.signals import worker_init

from broker import indexes, jobs
from broker.cancel import is_cancelled
from broker.celery_app import create_celery
from broker.events import EventWriter
from broker.keys import Keys
from broker.queues import GENERATE_TASK, GENERATION_QUEUE, RETRIEVAL_QUEUE, RETRIEVE_TASK
from broker.redis_pool import sync_client
from broker.settings import get_settings
from workers import heartbeat
from workers.retrieval import index_store
from workers.retrieval.embedder import Embedder
from workers.retrieval.index_store import IndexCache, UnknownIndex

log = logging.getLogger(__name__)
settings = get_settings()
keys = Keys(settings.key_prefix)
app = create_celery(settings)
heartbeat.install(app, RETRIEVAL_QUEUE, settings)


@dataclass(slots=True)
class _State:
    embedder: Embedder
    indexes: IndexCache


_state: _State | None = None


def state() -> _State:
    global _state
    if _state is None:
        client = sync_client(settings)
        _state = _State(
            embedder=Embedder(settings),
            indexes=IndexCache(client, keys, ef_search=settings.hnsw_ef_search),
        )
    return _state


@worker_init.connect(weak=False)
def _warm_up(**_: object) -> None:
    client = sync_client(settings)
    # Redis may have restarted without persistence: re-register what is on disk.
    for info in index_store.current_on_disk(settings.indexes_dir):
        if indexes.lookup(client, keys, info.name) is None:
            indexes.register(client, keys, info)
    state().embedder.encode(["warm up"])


def _writer(request_id: str, job_id: str | None = None) -> EventWriter:
    client = sync_client(settings)
    return EventWriter(
        client,
        keys,
        request_id,
        ttl_s=settings.event_stream_ttl_s,
        maxlen=settings.event_stream_maxlen,
        job=jobs.tracker(client, settings, job_id),
    )


@app.task(name=RETRIEVE_TASK)
def retrieve(
    *,
    request_id: str,
    query: str,
    top_k: int,
    mode: str,
    index: str,
    enqueued_at: float,
    job_id: str | None = None,
) -> None:
    picked_at = time.time()
    writer = _writer(request_id, job_id)
    if not writer.start("retrieving"):  # redelivered after it finished, or a cancelled job
        return
    timings: dict[str, float] = {"queue_ms": max(0.0, (picked_at - enqueued_at) * 1000)}
    try:
        loaded = state().indexes.get(index)
    except UnknownIndex:
        writer.emit("error", {"status": 404, "message": f"unknown index {index!r}"})
        return
    try:
        started = time.perf_counter()
        vectors = state().embedder.encode([query])
        hits = loaded.search(vectors, top_k)[0]
        timings["retrieval_ms"] = (time.perf_counter() - started) * 1000
    except Exception as exc:
        log.exception("retrieval failed for %s", request_id)
        writer.emit("error", {"status": 500, "message": f"retrieval failed: {exc}"})
        return
    sources: list[dict[str, Any]] = [
        {"chunk_id": c.chunk_id, "source": c.source, "title": c.title, "text": c.text, "score": score}
        for c, score in hits
    ]
    writer.emit("sources", {"sources": sources, "index_version": loaded.info.version})
    if mode == "retrieval":
        writer.emit("done", {"answer": None, "usage": None, "timings": timings})
        return
    if is_cancelled(sync_client(settings), keys, request_id):
        writer.emit("error", {"status": jobs.CANCELLED_STATUS, "message": "cancelled"})
        return
    app.send_task(
        GENERATE_TASK,
        kwargs={
            "request_id": request_id,
            "query": query,
            "sources": sources,
            "timings": timings,
            "enqueued_at": time.time(),
            "job_id": job_id,
        },
        queue=GENERATION_QUEUE,
    )
