"""The retrieval worker: ``celery -A workers.retrieval.app:app worker -Q retrieval -P solo``.

The API sends coalesced batches, so one task is many queries. The solo pool runs each batch on
the main thread: encoding there avoids the OpenMP spin-wait penalty of a pool thread (measured
~2× for a lone query), and batches need no concurrency inside one process — the encoder uses
every core it is given. Scale out with processes.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import Task
from celery.signals import worker_init

from broker import documents, indexes, jobs
from broker.cancel import is_cancelled
from broker.celery_app import create_celery
from broker.contract import Cancelled, ContractError, Error, GenerateTask, RetrieveTask, StreamEvent
from broker.events import EventWriter, emit_many, finished
from broker.keys import Keys
from broker.queues import GENERATE_TASK, GENERATION_QUEUE, RETRIEVAL_QUEUE, RETRIEVE_TASK
from broker.redis_pool import sync_client
from broker.settings import get_settings
from workers import heartbeat, metrics_server
from workers.finished_streams import finished_ttl
from workers.retrieval import index_store
from workers.retrieval.batch import BatchRetriever, Retrieved
from workers.retrieval.embedder import Embedder
from workers.retrieval.embedding_cache import EmbeddingCache
from workers.retrieval.index_store import IndexCache
from workers.retrieval.ingest import catalog
from workers.retrieval.rerank import reranker

log = logging.getLogger(__name__)
settings = get_settings()
retrieval = settings.retrieval
streams = settings.redis
keys = Keys(streams.key_prefix)
app = create_celery(settings.redis)
metrics_server.install(settings.redis)
heartbeat.install(app, RETRIEVAL_QUEUE, settings.redis, host_defaults=settings.host_defaults_line())

_retriever: BatchRetriever | None = None


def retriever() -> BatchRetriever:
    global _retriever
    if _retriever is None:
        client = sync_client(streams)
        embedder = Embedder(retrieval)
        cache = EmbeddingCache.for_settings(
            client, keys, retrieval, model_id=embedder.model_id, dim=embedder.dim
        )
        _retriever = BatchRetriever(
            retrieval,
            embedder,
            cache,
            IndexCache(client, keys, ef_search=retrieval.hnsw_ef_search),
            reranker=reranker(retrieval),
        )
    return _retriever


@worker_init.connect(weak=False)
def _warm_up(**_: object) -> None:
    client = sync_client(streams)
    # Redis may have restarted without persistence: re-register what is on disk.
    for info in index_store.current_on_disk(settings.indexes_dir):
        if indexes.lookup(client, keys, info.name) is None:
            indexes.register(client, keys, info)
        # Load every current index now, so no first request pays for reading it from disk.
        loaded = retriever().indexes.get(info.name)
        # A version ingested before documents were listed (GET /v1/indexes/{name}/documents).
        if not documents.listed(client, keys, info.name, loaded.info.version):
            documents.write(client, keys, info.name, loaded.info.version, catalog(loaded.chunks))
    retriever().embed_warm_up()


def _job_writer(request_id: str, job_id: str) -> EventWriter:
    client = sync_client(streams)
    return EventWriter(
        client,
        keys,
        request_id,
        ttl_s=streams.event_stream_ttl_s,
        maxlen=streams.event_stream_maxlen,
        job=jobs.tracker(client, keys, settings.jobs, job_id),
        finished_ttl=finished_ttl(),
    )


@app.task(name=RETRIEVE_TASK, bind=True)
def retrieve(self: Task, **kwargs: Any) -> None:
    """A batch of queries (:class:`~broker.contract.RetrieveTask`)."""
    picked_at = time.time()
    try:
        requests = RetrieveTask.decode(kwargs).requests
    except ContractError as exc:
        # Acknowledged and dropped: a redelivery would fail the same way.
        log.error("rejected %s task %s: %s", RETRIEVE_TASK, self.request.id, exc)
        return
    client = sync_client(streams)
    # A redelivered batch (its worker died, or stopped before it ran it) skips the requests that
    # already finished; a first delivery has none (only the API sends batches), so it spends no
    # round trip asking. A job also moves to `retrieving` here, or is skipped if it was cancelled.
    done: set[str] = set()
    if (self.request.delivery_info or {}).get("redelivered"):
        done = finished(client, keys, [r.request_id for r in requests])
    writers = {r.request_id: _job_writer(r.request_id, r.job_id) for r in requests if r.job_id}
    pending = [
        r
        for r in requests
        if r.request_id not in done
        and (r.request_id not in writers or writers[r.request_id].start("retrieving"))
    ]
    if not pending:
        return
    result: Retrieved | None = None
    result_events: list[tuple[str, StreamEvent]]
    to_generate: list[GenerateTask]
    try:
        result = retriever().run(pending, picked_at=picked_at)
    except Exception as exc:
        log.exception("retrieval batch of %d failed", len(pending))
        failed = Error(status=500, message=f"retrieval failed: {exc}")
        result_events = [(r.request_id, failed) for r in pending]
        to_generate = []
    else:
        result_events, to_generate = result.events, result.to_generate
    # Job events go through their writer, which finishes the job atomically with its final event.
    plain = [e for e in result_events if e[0] not in writers]
    # The monitor's service rate counts the whole batch as completed retrievals.
    emit_many(
        client,
        keys,
        plain,
        ttl_s=streams.event_stream_ttl_s,
        maxlen=streams.event_stream_maxlen,
        completes=(RETRIEVAL_QUEUE, len(pending), time.time() - picked_at),
        finished_ttl=finished_ttl(),
    )
    for request_id, event in result_events:
        if request_id in writers:
            writers[request_id].emit(event)
    for task in to_generate:
        if task.request_id in writers and is_cancelled(client, keys, task.request_id):
            writers[task.request_id].emit(Cancelled())
            continue
        sent = task.model_copy(update={"enqueued_at": time.time()})
        app.send_task(GENERATE_TASK, kwargs=sent.encode(), queue=GENERATION_QUEUE)
    if result is not None:
        try:
            result.write_cache()
        except Exception:  # a cache write lost costs one encode later, nothing more
            log.warning("embedding cache write failed", exc_info=True)
