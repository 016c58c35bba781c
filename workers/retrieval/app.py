"""The retrieval worker: ``celery -A ragline.workers.retrieval.app:app worker -Q retrieval -P solo``.

The API sends coalesced batches, so one task is many queries. The solo pool runs each batch on
the main thread: encoding there avoids the OpenMP spin-wait penalty of a pool thread (measured
~2× for a lone query), and batches need no concurrency inside one process — the encoder uses
every core it is given. Scale out with processes.

A worker started with ``--shards NAME:KEY,...`` (RAGLINE_WORKER_SHARDS) serves only those shards
of sharded indexes, from their queues (``ragline.search_shard``), and takes no batches: a solo
worker waiting on a shard's reply could not serve that shard meanwhile (see shard_search.py).
One with ``all`` (the default) serves every shard: it looks for shards registered since it
started every ``RAGLINE_SHARD_WATCH_S``, loads them and consumes their queues too.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

import redis
from celery import bootsteps
from celery.worker.consumer import Consumer
from ragline.broker import metrics
from ragline.broker.config.settings import get_settings
from ragline.broker.contract.messages import (
    GenerateTask,
    RetrieveRequest,
    RetrieveTask,
    SearchShardTask,
    StreamEvent,
)
from ragline.broker.contract.queues import (
    GENERATE_TASK,
    GENERATION_QUEUE,
    RETRIEVAL_QUEUE,
    RETRIEVE_TASK,
    SEARCH_SHARD_TASK,
)
from ragline.broker.limits.backpressure import count_done
from ragline.broker.redis.durability import Replication
from ragline.broker.redis.pool import sync_client
from ragline.broker.state import documents, indexes, jobs, shards
from ragline.broker.state.semantic_cache import SemanticStore
from ragline.broker.streams.events import EventWriter, emit_many
from ragline.workers.bootstrap import bootstrap
from ragline.workers.finished_streams import finished_ttl
from ragline.workers.hooked_task import hooked_task
from ragline.workers.hooks import QueueWait, SkipExpired
from ragline.workers.retrieval.batch import FAILED, BatchRetriever, Retrieved
from ragline.workers.retrieval.batch_jobs import BatchJobs
from ragline.workers.retrieval.embedder import Embedder
from ragline.workers.retrieval.embedding_cache import EmbeddingCache
from ragline.workers.retrieval.filter_rows import FilterCache
from ragline.workers.retrieval.index_builders import HnswParams
from ragline.workers.retrieval.index_cache import IndexCache, Loading, UnknownIndex
from ragline.workers.retrieval.index_files import current_on_disk, shard_maps_on_disk
from ragline.workers.retrieval.ingest import catalog
from ragline.workers.retrieval.rerank import reranker
from ragline.workers.retrieval.semantic_cache import SemanticCache
from ragline.workers.retrieval.shard_search import ShardSearch, serve
from ragline.workers.retrieval.sharded_ingest import register_sharded
from ragline.workers.task_call import REDIS_UNREACHABLE, TaskCall
from ragline.workers.tracing import Served, Traced

log = logging.getLogger(__name__)
settings = get_settings()
retrieval = settings.retrieval
streams = settings.redis
# None: every shard (searched in process); empty: none; else only these, and no batches.
held_shards = shards.parse_selection(retrieval.worker_shards)

_retriever: BatchRetriever | None = None
_indexes: IndexCache | None = None


def loaded_indexes() -> IndexCache:
    global _indexes
    if _indexes is None:
        # In the background: a batch never waits for a version to load (index_cache.py).
        _indexes = IndexCache(
            sync_client(streams),
            keys,
            ef_search=retrieval.hnsw_ef_search,
            background=True,
            filter_cache=FilterCache(retrieval.filter_cache_bytes),
        )
    return _indexes


def _send_shard_task(task: SearchShardTask) -> None:
    app.send_task(SEARCH_SHARD_TASK, kwargs=task.encode(), queue=shards.shard_queue(task.shard))


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
            loaded_indexes(),
            reranker=reranker(retrieval),
            shards=ShardSearch(
                client,
                keys,
                retrieval,
                loaded_indexes(),
                _send_shard_task,
                held=held_shards,
                socket_timeout_s=streams.redis_socket_timeout_s,
                heartbeat_ttl_s=streams.worker_heartbeat_ttl_s,
            ),
            semantic=_semantic_cache(client, embedder.dim),
        )
    return _retriever


def _semantic_cache(client: redis.Redis, dim: int) -> SemanticCache:
    """Always there: a request says whether to look it up (the API's `semantic_cache` setting)."""
    store = SemanticStore(
        client,
        keys,
        # A miss's pending entry waits for its answer as long as the answer's stream may live.
        pending_ttl_s=streams.event_stream_ttl_s,
        max_memory_fraction=retrieval.cache_write_max_memory_fraction,
    )
    return SemanticCache(
        store,
        dim=dim,
        threshold=retrieval.semantic_cache_threshold,
        hnsw=HnswParams(retrieval.hnsw_m, retrieval.hnsw_ef_construction, retrieval.hnsw_ef_search),
        scope_max_entries=retrieval.semantic_cache_scope_max_entries,
        loaded_scopes=retrieval.semantic_cache_loaded_scopes,
    )


def _warm_up() -> None:
    client = sync_client(streams)
    # Redis may have restarted without persistence: re-register what is on disk.
    for info in current_on_disk(settings.indexes_dir):
        if indexes.lookup(client, keys, info.name) is None:
            indexes.register(client, keys, info)
        if not _holds(info.name):
            continue
        # Load every current index now, so no first request waits for reading it from disk; one
        # that will not load is left out (its requests fail, alone), not every index with it.
        try:
            loaded = loaded_indexes().get(info.name)
        except Exception:
            log.exception("index %s not loaded at start; its requests fail until it loads", info.name)
            continue
        # A version ingested before documents were listed (GET /v1/indexes/{name}/documents).
        if not documents.listed(client, keys, info.name, loaded.info.version):
            documents.write(client, keys, info.name, loaded.info.version, catalog(loaded.chunks))
    for shard_map in shard_maps_on_disk(settings.indexes_dir):
        if shards.lookup(client, keys, shard_map.index) is None:
            register_sharded(client, keys, settings.indexes_dir, shard_map)
    if not held_shards:  # a shard worker never embeds
        retriever().embed_warm_up()


worker = bootstrap(RETRIEVAL_QUEUE, settings, init=[_warm_up])
app, keys = worker.app, worker.keys


class ShardWatch(bootsteps.StartStopStep):
    """Serves the shards registered after this worker started (``--shards all`` only): every
    ``shard_watch_s`` on the consumer's own event loop, so between batches, as Celery's
    ``add_consumer`` control command calls ``add_task_queue``; a new shard is loaded before its
    queue is consumed and its heartbeat written, so its first search finds it ready."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Consumer, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self._tref: Any = None

    def start(self, c: Consumer) -> None:
        # Started again after a lost connection; queues added before are consumed again then,
        # since add_task_queue also selects them in the app's queue list.
        self._tref = c.timer.call_repeatedly(retrieval.shard_watch_s, _serve_new_shards, (c,))

    def stop(self, c: Consumer) -> None:
        if self._tref is not None:
            self._tref.cancel()
            self._tref = None

    shutdown = stop


def _serve_new_shards(consumer: Consumer) -> None:
    """Load and consume every registered shard whose queue is not consumed yet."""
    if consumer.task_consumer is None:  # between a lost connection and its restart
        return
    try:
        registered = shards.shard_queues(shards.all_maps(sync_client(streams), keys))
    except redis.RedisError:
        log.warning("could not read the shard maps; new shards wait for the next check", exc_info=True)
        return
    for queue, shard in registered.items():
        if consumer.task_consumer.consuming_from(queue):
            continue
        try:
            # Loaded in a thread, not here on the consumer's loop: its queue is consumed from the
            # first check that finds it loaded.
            if loaded_indexes().serving(shard).loaded is None:
                continue
        except UnknownIndex:
            continue  # its map outlived it: nothing to serve
        except Exception:
            log.exception("could not look shard %s up; tried again at the next check", shard)
            continue
        consumer.add_task_queue(queue)
        worker.heartbeat.add(queue)
        log.info("serving shard %s, registered since this worker started", shard)


if held_shards is None and retrieval.shard_watch_s > 0:
    app.steps["consumer"].add(ShardWatch)


def _holds(index: str) -> bool:
    """Whether this worker serves ``index``: a plain index when it takes batches, a shard when
    it holds it."""
    if shards.split_shard(index) is None:
        return not held_shards
    return held_shards is None or index in held_shards


def _job_writer(request_id: str, job_id: str) -> EventWriter:
    client = sync_client(streams)
    return EventWriter(
        client,
        keys,
        request_id,
        ttl_s=streams.event_stream_ttl_s,
        maxlen=streams.event_stream_maxlen,
        job=jobs.tracker(client, keys, settings.jobs, job_id, Replication.of(streams)),
        finished_ttl=finished_ttl(),
    )


batch_jobs = BatchJobs("retrieving", lambda: sync_client(streams), keys, _job_writer)
# After batch_jobs (only the requests this run serves), last (its spans see the body's own error).
traced: Traced[RetrieveTask] = Traced(
    "ragline.retrieve",
    lambda call: [Served(r.request_id, r.enqueued_at) for r in batch_jobs.serving(call).pending],
    batch="ragline.retrieve.batch",
)


@hooked_task(
    app,
    RETRIEVE_TASK,
    RetrieveTask,
    [
        batch_jobs,
        QueueWait(RETRIEVAL_QUEUE, lambda call: [r.enqueued_at for r in batch_jobs.serving(call).pending]),
        traced,
    ],
)
def retrieve(call: TaskCall[RetrieveTask]) -> None:
    """A batch of queries (:class:`~ragline.broker.contract.messages.RetrieveTask`)."""
    client = sync_client(streams)
    pending, writers = batch_jobs.serving(call).pending, batch_jobs.serving(call).writers
    result: Retrieved | None = None
    result_events: list[tuple[str, StreamEvent]]
    to_generate: list[GenerateTask]
    try:
        result = retriever().run(pending, picked_at=call.picked_at)
    except REDIS_UNREACHABLE:
        raise  # the batch goes back to its queue (hooked_task.py), none of its requests failed
    except Exception:
        # The batch fails request by request inside run(); this is what is left (a bug, say).
        log.exception("retrieval batch of %d failed", len(pending))
        result_events = [(r.request_id, FAILED) for r in pending]
        to_generate = []
    else:
        result_events, to_generate = result.events, result.to_generate
        for waiting in result.deferred:
            waiting.loading.when_done(partial(_send_again, waiting.requests))
    deferred = result.deferred_requests if result is not None else 0
    # Job events go through their writer, which finishes the job atomically with its final event.
    plain = [e for e in result_events if e[0] not in writers]
    # The monitor's service rate counts the whole batch as completed retrievals.
    emit_many(
        client,
        keys,
        plain,
        ttl_s=streams.event_stream_ttl_s,
        maxlen=streams.event_stream_maxlen,
        completes=(RETRIEVAL_QUEUE, len(pending) - deferred, time.time() - call.picked_at),
        finished_ttl=finished_ttl(),
    )
    for request_id, event in result_events:
        if request_id in writers:
            writers[request_id].emit(event)
    for task in to_generate:
        if batch_jobs.stopped_for_cancel(call, task.request_id):
            continue
        sent = task.model_copy(update={"enqueued_at": time.time()})
        headers = traced.headers(call, task.request_id)
        app.send_task(GENERATE_TASK, kwargs=sent.encode(), queue=GENERATION_QUEUE, headers=headers)
    if result is not None:
        try:
            result.write_cache()
        except Exception:  # a cache write lost costs one encode later, nothing more
            log.warning("embedding cache write failed", exc_info=True)


def _send_again(requests: list[RetrieveRequest]) -> None:
    """Requests that waited for their index's version to load, back on the queue as a batch of
    their own (their ``enqueued_at`` kept: the wait is theirs). Called on the loading thread."""
    try:
        app.send_task(RETRIEVE_TASK, kwargs=RetrieveTask(requests=requests).encode(), queue=RETRIEVAL_QUEUE)
    except Exception:
        # Their callers' deadlines end them; nothing else holds them.
        log.exception("could not send %d requests again after their index loaded", len(requests))


@hooked_task(
    app,
    SEARCH_SHARD_TASK,
    SearchShardTask,
    # Past its deadline its coordinator has answered without it (a backlog, or a redelivery).
    [SkipExpired(lambda task: task.deadline)],
)
def search_shard(call: TaskCall[SearchShardTask]) -> None:
    """One shard's part of a sharded search (:class:`~ragline.broker.contract.messages.SearchShardTask`)."""
    task = call.payload
    client = sync_client(streams)
    reply = serve(task, loaded_indexes(), retrieval)
    if isinstance(reply, Loading):
        # Its shard's registered version is loading here: the task comes back once it is in
        # (past its deadline, it is dropped then).
        reply.when_done(partial(_send_shard_task, task))
        return
    metrics.SHARD_SEARCHES.labels(task.shard, "queue").inc()
    queue = shards.shard_queue(task.shard)
    with client.pipeline(transaction=False) as pipe:
        pipe.rpush(task.reply_to, reply.encode())
        pipe.expire(task.reply_to, max(1, int(retrieval.shard_timeout_ms / 1000) + 1))
        count_done(pipe, keys, queue, len(task.queries), time.time() - call.picked_at)
        pipe.execute()
