"""The retrieval worker: ``celery -A workers.retrieval.app:app worker -Q retrieval -P solo``.

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
from typing import Any

import redis
from celery import Task, bootsteps
from celery.signals import worker_init
from celery.worker.consumer import Consumer

from broker import documents, indexes, jobs, metrics, shards
from broker.backpressure import count_done
from broker.cancel import is_cancelled
from broker.celery_app import create_celery
from broker.contract import (
    Cancelled,
    ContractError,
    Error,
    GenerateTask,
    RetrieveTask,
    SearchShardTask,
    StreamEvent,
)
from broker.events import EventWriter, emit_many, finished
from broker.keys import Keys
from broker.queues import (
    GENERATE_TASK,
    GENERATION_QUEUE,
    RETRIEVAL_QUEUE,
    RETRIEVE_TASK,
    SEARCH_SHARD_TASK,
)
from broker.redis_pool import sync_client
from broker.settings import get_settings
from workers import heartbeat, metrics_server
from workers.finished_streams import finished_ttl
from workers.retrieval import index_store
from workers.retrieval.batch import BatchRetriever, Retrieved
from workers.retrieval.embedder import Embedder
from workers.retrieval.embedding_cache import EmbeddingCache
from workers.retrieval.index_store import IndexCache, UnknownIndex
from workers.retrieval.ingest import catalog
from workers.retrieval.rerank import reranker
from workers.retrieval.shard_search import ShardSearch, serve
from workers.retrieval.sharded_ingest import register_sharded

log = logging.getLogger(__name__)
settings = get_settings()
retrieval = settings.retrieval
streams = settings.redis
keys = Keys(streams.key_prefix)
app = create_celery(settings.redis)
metrics_server.install(settings.redis)
beat_also = heartbeat.install(
    app, RETRIEVAL_QUEUE, settings.redis, host_defaults=settings.host_defaults_line()
)
# None: every shard (searched in process); empty: none; else only these, and no batches.
held_shards = shards.parse_selection(retrieval.worker_shards)

_retriever: BatchRetriever | None = None
_indexes: IndexCache | None = None


def loaded_indexes() -> IndexCache:
    global _indexes
    if _indexes is None:
        _indexes = IndexCache(sync_client(streams), keys, ef_search=retrieval.hnsw_ef_search)
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
        )
    return _retriever


@worker_init.connect(weak=False)
def _warm_up(**_: object) -> None:
    client = sync_client(streams)
    # Redis may have restarted without persistence: re-register what is on disk.
    for info in index_store.current_on_disk(settings.indexes_dir):
        if indexes.lookup(client, keys, info.name) is None:
            indexes.register(client, keys, info)
        if not _holds(info.name):
            continue
        # Load every current index now, so no first request pays for reading it from disk.
        loaded = loaded_indexes().get(info.name)
        # A version ingested before documents were listed (GET /v1/indexes/{name}/documents).
        if not documents.listed(client, keys, info.name, loaded.info.version):
            documents.write(client, keys, info.name, loaded.info.version, catalog(loaded.chunks))
    for shard_map in index_store.shard_maps_on_disk(settings.indexes_dir):
        if shards.lookup(client, keys, shard_map.index) is None:
            register_sharded(client, keys, settings.indexes_dir, shard_map)
    if not held_shards:  # a shard worker never embeds
        retriever().embed_warm_up()


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
            loaded_indexes().get(shard)
        except UnknownIndex:
            continue  # its map outlived it: nothing to serve
        except Exception:
            log.exception("could not load shard %s; tried again at the next check", shard)
            continue
        consumer.add_task_queue(queue)
        beat_also(queue)
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


@app.task(name=SEARCH_SHARD_TASK, bind=True)
def search_shard(self: Task, **kwargs: Any) -> None:
    """One shard's part of a sharded search (:class:`~broker.contract.SearchShardTask`)."""
    picked_at = time.time()
    try:
        task = SearchShardTask.decode(kwargs)
    except ContractError as exc:
        log.error("rejected %s task %s: %s", SEARCH_SHARD_TASK, self.request.id, exc)
        return
    if picked_at > task.deadline:
        # Its coordinator has answered without it (a backlog, or a redelivery after a crash).
        log.info("skipped shard search %s of %s: past its deadline", task.search_id, task.shard)
        return
    client = sync_client(streams)
    reply = serve(task, loaded_indexes(), retrieval)
    metrics.SHARD_SEARCHES.labels(task.shard, "queue").inc()
    queue = shards.shard_queue(task.shard)
    with client.pipeline(transaction=False) as pipe:
        pipe.rpush(task.reply_to, reply.encode())
        pipe.expire(task.reply_to, max(1, int(retrieval.shard_timeout_ms / 1000) + 1))
        count_done(pipe, keys, queue, len(task.queries), time.time() - picked_at)
        pipe.execute()
