"""Searching one loaded index for a group of queries, and scatter-gather over a sharded index.

A batch's worker embeds its queries once. For a sharded index it searches the shards it holds
itself and sends one :class:`~ragline.broker.contract.messages.SearchShardTask` (vectors
included) to each other
shard's queue; the replies come back on one Redis list, read with a deadline. Each query's
candidates from every shard are merged by score into one list as deep as an unsharded search's,
so the ranking after it (reranker, diversity) is the one an unsharded index gets. A shard that
has not answered by the deadline is left out and named; nothing waits past it. A shard whose
queue no live worker consumes (by heartbeat) is left out at once, and is sent nothing.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import redis
from ragline.broker import metrics
from ragline.broker.config.settings import RetrievalSettings
from ragline.broker.contract.messages import (
    ContractError,
    MetadataFilter,
    SearchShardTask,
    ShardChunk,
    ShardHit,
    ShardQuery,
    ShardReply,
)
from ragline.broker.contract.records import IndexInfo
from ragline.broker.redis.keys import Keys
from ragline.broker.state import indexes, liveness, shards
from ragline.workers.retrieval.chunking import Chunk
from ragline.workers.retrieval.index_cache import IndexCache, Loading, UnknownIndex
from ragline.workers.retrieval.lexical import LexicalIndex
from ragline.workers.retrieval.loaded_index import LoadedIndex, SearchKnobs
from ragline.workers.retrieval.search import Candidate, fuse

log = logging.getLogger(__name__)

# (query, mode): what one search answers; the same text in two modes is two searches.
QueryKey = tuple[str, str]
# Sends one shard's task to its queue.
SendShardTask = Callable[[SearchShardTask], None]


def search_loaded(
    loaded: LoadedIndex,
    queries: Sequence[QueryKey],
    vector_of: Callable[[str], np.ndarray],
    depth: int,
    knobs: SearchKnobs,
    flt: MetadataFilter | None,
    settings: RetrievalSettings,
) -> dict[QueryKey, list[Candidate]]:
    """One dense search for the dense and hybrid queries, one lexical search for the lexical and
    hybrid ones, ``depth`` deep; each query's candidates, best first."""
    allowed = loaded.filter_rows(flt) if flt else None
    dense_q = sorted({q for q, mode in queries if mode != "lexical"})
    lexical_q = sorted({q for q, mode in queries if mode != "dense"})
    dense: dict[str, list[tuple[int, float]]] = {}
    lexical: dict[str, list[tuple[int, float]]] = {}
    if dense_q:
        rows = np.stack([vector_of(q) for q in dense_q])
        dense = dict(zip(dense_q, loaded.search_rows(rows, depth, knobs, allowed=allowed), strict=True))
    if lexical_q:
        lexical = dict(
            zip(lexical_q, _lexical(loaded).search(lexical_q, depth, allowed=allowed), strict=True)
        )
    out: dict[QueryKey, list[Candidate]] = {}
    for q, mode in queries:
        if mode == "dense":
            out[(q, mode)] = [Candidate(row, score, score) for row, score in dense[q]]
        elif mode == "lexical":
            out[(q, mode)] = [Candidate(row, score) for row, score in lexical[q]]
        else:
            out[(q, mode)] = fuse(
                dense[q],
                lexical[q],
                rrf_k=settings.rrf_k,
                dense_weight=settings.hybrid_dense_weight,
                lexical_weight=settings.hybrid_lexical_weight,
            )
    return out


def _lexical(loaded: LoadedIndex) -> LexicalIndex:
    if loaded.lexical is None:  # an index loaded without one (tests, tools): build it once
        loaded.lexical = LexicalIndex.build([c.embed_text for c in loaded.chunks])
    return loaded.lexical


# -- a shard worker's side ------------------------------------------------------------------------


def serve(task: SearchShardTask, indexes_: IndexCache, settings: RetrievalSettings) -> ShardReply | Loading:
    """One shard's answer to a shard task (an error reply when it cannot search), or the load
    it waits for: a registered version of the shard not loaded yet is loaded beside the one
    served, and the task waits for it outside this worker's tasks (sent again once it is in; its
    coordinator's deadline still bounds the wait), as the shard would be searched in process."""
    try:
        serving = indexes_.serving(task.shard)
    except UnknownIndex:
        return ShardReply(search_id=task.search_id, shard=task.shard, error=f"unknown shard {task.shard!r}")
    if serving.loading is not None and serving.must_wait(serving.loading.version):
        return serving.loading
    loaded = serving.loaded
    if loaded is None:
        error = f"shard {task.shard!r} could not be loaded"
        return ShardReply(search_id=task.search_id, shard=task.shard, error=error)
    vectors = {q.query: np.asarray(q.vector, dtype=np.float32) for q in task.queries if q.vector is not None}
    keys = [(q.query, q.mode) for q in task.queries]
    knobs = SearchKnobs(
        ef_search=task.ef_search, nprobe=task.nprobe, refine_k_factor=settings.ivf_refine_k_factor
    )
    found = search_loaded(loaded, keys, vectors.__getitem__, task.depth, knobs, task.filter, settings)
    hits = [[_hit(loaded.chunks[c.row], c) for c in found[k]] for k in keys]
    return ShardReply(search_id=task.search_id, shard=task.shard, version=loaded.info.version, hits=hits)


def _hit(chunk: Chunk, c: Candidate) -> ShardHit:
    shipped = ShardChunk(
        chunk_id=chunk.chunk_id,
        source=chunk.source,
        title=chunk.title,
        text=chunk.text,
        anchors=chunk.anchors,
        meta=chunk.meta,
    )
    return ShardHit(chunk=shipped, score=c.score, dense=c.dense)


def _chunk(shipped: ShardChunk) -> Chunk:
    return Chunk(
        chunk_id=shipped.chunk_id,
        source=shipped.source,
        title=shipped.title,
        text=shipped.text,
        anchors=shipped.anchors,
        meta=dict(shipped.meta),
    )


# -- the coordinator's side -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sharded:
    """A sharded index as the registry has it: its map, its logical entry, and the version of
    each of its shards (what an answer must come from to be the logical version's)."""

    shard_map: shards.ShardMap
    info: IndexInfo
    versions: dict[str, str]


@dataclass(slots=True)
class Gathered:
    """One group's merged search over a sharded index: candidates' rows index ``chunks``."""

    info: IndexInfo
    chunks: list[Chunk] = field(default_factory=list)
    candidates: dict[QueryKey, list[Candidate]] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    # Some shard answered from another version than the registered one (a new one still loading
    # beside it): the answer is not the logical version's, so it must not be cached as it.
    stale: bool = False


class ShardSearch:
    """Scatter-gather for sharded indexes, in a worker that takes retrieval batches.

    ``held``: the shards this worker searches itself (None: every one, as a single worker
    deployment has it); every other shard is asked over its queue.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        settings: RetrievalSettings,
        indexes_: IndexCache,
        send: SendShardTask,
        *,
        held: frozenset[str] | None,
        socket_timeout_s: float,
        heartbeat_ttl_s: float,
        recheck_s: float = 0.5,
        live_recheck_s: float = 1.0,
    ) -> None:
        self._client = client
        self._keys = keys
        self._settings = settings
        self._indexes = indexes_
        self._send = send
        self._held = held
        # A blocking read waits at most this long per call: under the client's socket timeout.
        self._max_block_s = max(0.1, socket_timeout_s - 1.0)
        self._recheck_s = recheck_s
        self._maps: dict[str, tuple[float, Sharded | None]] = {}
        self._heartbeat_ttl_s = heartbeat_ttl_s
        self._live_recheck_s = live_recheck_s
        # Shard -> (when read, whether a live worker consumes its queue).
        self._live: dict[str, tuple[float, bool]] = {}

    def sharded(self, index: str, *, version: str | None = None) -> Sharded | None:
        """``index``'s shard map, logical entry and shard versions, or None for a plain (or unknown) index;
        rechecked at most every ``recheck_s``, so a plain index costs no round trip per batch, and
        at once when ``version`` (what the API saw) is not the cached one: an upload that made a
        shard must not be answered, and cached, from the shards before it."""
        now = time.monotonic()
        cached = self._maps.get(index)
        stale = (
            version is not None
            and cached is not None
            and cached[1] is not None
            and cached[1].info.version != version
        )
        if cached is not None and now - cached[0] < self._recheck_s and not stale:
            return cached[1]
        found: Sharded | None = None
        shard_map = shards.lookup(self._client, self._keys, index)
        if shard_map is not None:
            info, *parts = indexes.lookup_many(self._client, self._keys, [index, *shard_map.shards])
            if info is not None and info.index_type == shards.SHARDED_TYPE:
                versions = {p.name: p.version for p in parts if p is not None}
                found = Sharded(shard_map, info, versions)
        self._maps[index] = (now, found)
        return found

    def search(
        self,
        sharded: Sharded,
        queries: Sequence[QueryKey],
        vector_of: Callable[[str], np.ndarray],
        depth: int,
        knobs: SearchKnobs,
        flt: MetadataFilter | None,
    ) -> Gathered | Loading:
        """The group's merged search, or the load of a shard held here that it waits for (a
        registered version not loaded yet): the group then waits outside the batch, as one on a
        plain index does, and nothing is sent to the other shards."""
        info = sharded.info
        targets = sharded.shard_map.route(flt)
        local = [s for s in targets if self._held is None or s in self._held]
        remote = [s for s in targets if s not in local]
        loaded_here: dict[str, LoadedIndex | None] = {}
        for shard in local:
            version = sharded.versions.get(shard)
            try:
                serving = self._indexes.serving(shard, version=version)
            except UnknownIndex:
                continue
            if serving.loading is not None and serving.must_wait(version):
                return serving.loading
            loaded_here[shard] = serving.loaded
        distinct = list(dict.fromkeys(queries))
        replies: dict[str, list[list[tuple[Chunk, float, float | None]]]] = {}
        errors: dict[str, str] = {}
        # Sent nothing, rather than sent and not waited for: nobody would take the task before
        # its deadline (whoever serves the shard later skips it), and meanwhile it would count as
        # waiting in the shard queue's metrics. A worker that comes up is seen when the
        # heartbeats are next read (live_recheck_s).
        unserved = self._without_worker(remote)
        for shard in unserved:
            errors[shard] = "no live worker serves its queue"
        remote = [s for s in remote if s not in unserved]
        started = time.time()
        deadline = started + self._settings.shard_timeout_ms / 1000
        search_id = uuid.uuid4().hex
        reply_to = self._keys.shard_reply(search_id)
        if remote:
            shipped = [
                ShardQuery(query=q, mode=mode, vector=None if mode == "lexical" else vector_of(q).tolist())  # type: ignore[arg-type]  # mode: a RetrievalMode
                for q, mode in distinct
            ]
            for shard in remote:
                self._send(
                    SearchShardTask(
                        search_id=search_id,
                        reply_to=reply_to,
                        shard=shard,
                        queries=shipped,
                        depth=depth,
                        filter=flt,
                        ef_search=knobs.ef_search,
                        nprobe=knobs.nprobe,
                        deadline=deadline,
                    )
                )
        # Each shard's version that answered, to compare with the registered ones.
        answered: dict[str, str] = {}
        # The shards held here are searched while the others work on theirs.
        for shard in local:
            if shard not in loaded_here:
                errors[shard] = "unknown shard"
                continue
            loaded = loaded_here[shard]
            if loaded is None:
                errors[shard] = "could not be loaded"
                continue
            found = search_loaded(loaded, distinct, vector_of, depth, knobs, flt, self._settings)
            replies[shard] = [[(loaded.chunks[c.row], c.score, c.dense) for c in found[k]] for k in distinct]
            answered[shard] = loaded.info.version
            metrics.SHARD_SEARCHES.labels(shard, "local").inc()
        if remote:
            self._gather(reply_to, search_id, set(remote), deadline, distinct, replies, errors, answered)
        missing = tuple(s for s in targets if s not in replies)
        for shard in missing:
            metrics.SHARD_MISSING.labels(shard).inc()
            log.warning(
                "shard %s left out of a search of %s: %s", shard, info.name, errors.get(shard, "timeout")
            )
        gathered = _merge(info, targets, replies, distinct, depth, missing)
        gathered.stale = any(sharded.versions.get(s) != v for s, v in answered.items())
        return gathered

    def _without_worker(self, remote: Sequence[str]) -> set[str]:
        """The shards among ``remote`` whose queue has no fresh heartbeat; those not read within
        ``live_recheck_s`` are read in one round trip."""
        now = time.monotonic()
        stale = [s for s in remote if s not in self._live or now - self._live[s][0] >= self._live_recheck_s]
        if stale:
            queues = tuple(shards.shard_queue(s) for s in stale)
            try:
                counts = liveness.sync_live_counts(self._client, self._keys, queues, self._heartbeat_ttl_s)
            except redis.RedisError:
                # Asked anyway: the deadline still bounds the wait, and it is read again next time.
                log.warning("could not read the shard workers' heartbeats", exc_info=True)
                return set()
            for shard, queue in zip(stale, queues, strict=True):
                self._live[shard] = (now, counts[queue] > 0)
        return {s for s in remote if not self._live[s][1]}

    def _gather(
        self,
        reply_to: str,
        search_id: str,
        waiting: set[str],
        deadline: float,
        distinct: list[QueryKey],
        replies: dict[str, list[list[tuple[Chunk, float, float | None]]]],
        errors: dict[str, str],
        answered: dict[str, str],
    ) -> None:
        try:
            while waiting:
                left = deadline - time.time()
                if left <= 0:
                    break
                popped = self._client.blpop([reply_to], timeout=min(left, self._max_block_s))
                if popped is None:
                    continue
                try:
                    reply = ShardReply.decode(popped[1])
                except ContractError as exc:
                    log.error("dropped a shard reply: %s", exc)
                    continue
                if reply.search_id != search_id or reply.shard not in waiting:
                    continue
                waiting.discard(reply.shard)
                if reply.error is not None or len(reply.hits) != len(distinct):
                    errors[reply.shard] = reply.error or "reply does not match the queries"
                    continue
                replies[reply.shard] = [
                    [(_chunk(h.chunk), h.score, h.dense) for h in row] for row in reply.hits
                ]
                answered[reply.shard] = reply.version or ""
        finally:
            # Replies that come after the deadline have nobody to read them.
            self._client.delete(reply_to)


def _merge(
    info: IndexInfo,
    targets: Sequence[str],
    replies: dict[str, list[list[tuple[Chunk, float, float | None]]]],
    distinct: list[QueryKey],
    depth: int,
    missing: tuple[str, ...],
) -> Gathered:
    """Per query, every shard's candidates by score (ties: shard order, then rank), ``depth`` deep."""
    gathered = Gathered(info=info, missing=missing)
    order = {s: i for i, s in enumerate(targets)}
    for qi, key in enumerate(distinct):
        pooled = [
            (-score, order[shard], rank, chunk, score, dense)
            for shard, rows in replies.items()
            for rank, (chunk, score, dense) in enumerate(rows[qi])
        ]
        pooled.sort(key=lambda p: p[:3])
        merged = []
        for *_, chunk, score, dense in pooled[:depth]:
            gathered.chunks.append(chunk)
            merged.append(Candidate(len(gathered.chunks) - 1, score, dense))
        gathered.candidates[key] = merged
    return gathered
