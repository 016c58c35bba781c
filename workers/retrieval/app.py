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

from celery.signals import worker_init

from broker import indexes
from broker.celery_app import create_celery
from broker.events import emit_many, finished
from broker.keys import Keys
from broker.queues import GENERATE_TASK, GENERATION_QUEUE, RETRIEVAL_QUEUE, RETRIEVE_TASK
from broker.redis_pool import sync_client
from broker.settings import get_settings
from workers import heartbeat
from workers.retrieval import index_store
from workers.retrieval.batch import BatchRetriever
from workers.retrieval.embedder import Embedder
from workers.retrieval.embedding_cache import EmbeddingCache
from workers.retrieval.index_store import IndexCache

log = logging.getLogger(__name__)
settings = get_settings()
keys = Keys(settings.key_prefix)
app = create_celery(settings)
heartbeat.install(app, RETRIEVAL_QUEUE, settings)

_retriever: BatchRetriever | None = None


def retriever() -> BatchRetriever:
    global _retriever
    if _retriever is None:
        client = sync_client(settings)
        embedder = Embedder(settings)
        cache = EmbeddingCache(
            client, keys, model_id=embedder.model_id, dim=embedder.dim, ttl_s=settings.embedding_cache_ttl_s
        )
        _retriever = BatchRetriever(
            settings, embedder, cache, IndexCache(client, keys, ef_search=settings.hnsw_ef_search)
        )
    return _retriever


@worker_init.connect(weak=False)
def _warm_up(**_: object) -> None:
    client = sync_client(settings)
    # Redis may have restarted without persistence: re-register what is on disk.
    for info in index_store.current_on_disk(settings.indexes_dir):
        if indexes.lookup(client, keys, info.name) is None:
            indexes.register(client, keys, info)
    retriever()


@app.task(name=RETRIEVE_TASK)
def retrieve(*, requests: list[dict[str, Any]]) -> None:
    picked_at = time.time()
    client = sync_client(settings)
    # A redelivered batch (its worker died) skips the requests that already finished.
    done = finished(client, keys, [r["request_id"] for r in requests])
    pending = [r for r in requests if r["request_id"] not in done]
    if not pending:
        return
    try:
        result = retriever().run(pending, picked_at=picked_at)
    except Exception as exc:
        log.exception("retrieval batch of %d failed", len(pending))
        events = [
            (r["request_id"], "error", {"status": 500, "message": f"retrieval failed: {exc}"})
            for r in pending
        ]
        emit_many(
            client,
            keys,
            events,
            ttl_s=settings.event_stream_ttl_s,
            maxlen=settings.event_stream_maxlen,
            completes=(RETRIEVAL_QUEUE, len(pending)),
        )
        return
    emit_many(
        client,
        keys,
        result.events,
        ttl_s=settings.event_stream_ttl_s,
        maxlen=settings.event_stream_maxlen,
        completes=(RETRIEVAL_QUEUE, len(pending)),
    )
    for r in result.to_generate:
        app.send_task(
            GENERATE_TASK,
            kwargs={
                "request_id": r["request_id"],
                "query": r["query"],
                "sources": r["sources"],
                "timings": r["timings"],
                "enqueued_at": time.time(),
            },
            queue=GENERATION_QUEUE,
        )
