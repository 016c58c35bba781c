"""One retrieval batch: one embedding call, and per index one FAISS search and one BM25 search,
for many queries; then per query fusion, the optional reranker, and the diversity caps.

The requests of a batch come from many callers, so none may fail another: whatever fails (an
index that will not load, a search, the encoder on one text, the reranker) is tried again for
each request alone, and only the requests that still fail get an ``error`` event, whose message
names no file (the worker's log has the details). A batch never loads an index: a request that
needs a version still loading waits for it outside the batch (``Retrieved.deferred``).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import faiss
import numpy as np
from ragline.broker import metrics, tracing
from ragline.broker.config.settings import RetrievalSettings
from ragline.broker.contract.messages import (
    Citation,
    Done,
    Error,
    GenerateTask,
    RetrieveRequest,
    SemanticMatch,
    Source,
    Sources,
    StreamEvent,
    Timings,
    filter_key,
)
from ragline.broker.contract.records import IndexInfo
from ragline.broker.state import shards as shard_names
from ragline.workers.retrieval.chunking import Chunk
from ragline.workers.retrieval.embedder import Embedder
from ragline.workers.retrieval.embedding_cache import EmbeddingCache
from ragline.workers.retrieval.index_cache import IndexCache, Loading, UnknownIndex
from ragline.workers.retrieval.loaded_index import LoadedIndex, SearchKnobs
from ragline.workers.retrieval.rerank import Reranker
from ragline.workers.retrieval.search import Candidate, diversify, search_depth
from ragline.workers.retrieval.semantic_cache import Hit, Probe, SemanticCache
from ragline.workers.retrieval.shard_search import ShardSearch, search_loaded
from ragline.workers.task_call import REDIS_UNREACHABLE

log = logging.getLogger(__name__)

# What a request that failed in the worker is told: nothing of the failure itself, which may
# name files, hosts or other tenants' indexes (the worker logs it, with the request's id).
FAILED = Error(
    status=500, message="retrieval failed in the worker (its log has why); no other request was affected"
)


@dataclass(frozen=True, slots=True)
class Deferred:
    """Requests that wait for an index version being loaded, outside the batch."""

    loading: Loading
    requests: list[RetrieveRequest]


@dataclass(frozen=True, slots=True)
class Retrieved:
    """What a batch produced: (request id, event) to write, and the generation tasks to send."""

    events: list[tuple[str, StreamEvent]]
    to_generate: list[GenerateTask]
    # The embedding-cache write, for after the answers are out (it is not on their path).
    write_cache: Callable[[], None]
    # Requests not answered here: each is sent again once its version is loaded.
    deferred: list[Deferred] = field(default_factory=list)

    @property
    def deferred_requests(self) -> int:
        return sum(len(d.requests) for d in self.deferred)


@dataclass(slots=True)
class _Ranked:
    request: RetrieveRequest
    info: IndexInfo
    # What the candidates' rows index: the index's chunks, or a sharded search's merged ones.
    chunks: Sequence[Chunk]
    candidates: list[Candidate]
    # The shards of a sharded index that did not answer.
    missing: tuple[str, ...] = ()
    # A sharded index's answer that is not its registered version's (a shard answered from the
    # version before the one registered, still loading): it names no version, so is not cached.
    stale: bool = False


@dataclass(slots=True)
class _Served:
    """What one group of a batch (or one request of it, alone) came to."""

    ranked: list[_Ranked] = field(default_factory=list)
    events: list[tuple[str, StreamEvent]] = field(default_factory=list)
    deferred: list[Deferred] = field(default_factory=list)


class BatchRetriever:
    def __init__(
        self,
        settings: RetrievalSettings,
        embedder: Embedder,
        cache: EmbeddingCache,
        indexes: IndexCache,
        reranker: Reranker | None = None,
        shards: ShardSearch | None = None,
        semantic: SemanticCache | None = None,
    ) -> None:
        self._settings = settings
        self._embedder = embedder
        self._cache = cache
        self.indexes = indexes
        self._reranker = reranker
        self._shards = shards
        self._semantic = semantic
        faiss.cvar.distance_compute_blas_threshold = settings.faiss_blas_threshold

    def embed_warm_up(self) -> None:
        """The first encode pays for lazy initialisation; pay it before taking work."""
        self._embedder.encode(["warm up"])

    def mode(self, request: RetrieveRequest) -> str:
        return request.retrieval or self._settings.retrieval_mode

    def _knobs(self, request: RetrieveRequest) -> SearchKnobs:
        return SearchKnobs(
            ef_search=request.ef_search,
            nprobe=request.nprobe,
            refine_k_factor=self._settings.ivf_refine_k_factor,
        )

    def _early_exit(self, request: RetrieveRequest, best: Candidate | None) -> bool:
        """Answer with the best source, skipping generation, when its cosine similarity clears the
        threshold and the request allows it (off unless RAGLINE_EARLY_EXIT_SCORE is set)."""
        threshold = self._settings.early_exit_score
        return bool(
            threshold > 0
            and best is not None
            and best.dense is not None
            and request.allow_early_exit
            and best.dense >= threshold
        )

    def _depth(self, top_k: int) -> int:
        return search_depth(self._settings.retrieval_candidates, top_k)

    def run(self, requests: list[RetrieveRequest], *, picked_at: float) -> Retrieved:
        metrics.COALESCED_BATCH.observe(len(requests))

        started = time.perf_counter()
        events: list[tuple[str, StreamEvent]] = []
        texts = sorted({r.query for r in requests if self.mode(r) != "lexical"})
        vectors, write_cache, unencoded = self._encode(texts)
        row_of = {t: i for i, t in enumerate(texts)}
        embed_s = time.perf_counter() - started
        metrics.EMBED_SECONDS.observe(embed_s)
        if tracing.active():
            tracing.record_perf(
                "ragline.retrieve.embed", started, started + embed_s, {"ragline.texts": len(texts)}
            )

        if self._semantic is not None:
            hits = self._semantic_hits(requests, vectors, row_of)
            for r in requests:
                if (hit := hits.get(r.request_id)) is not None:
                    events += _semantic_answer(r, hit, started=started, picked_at=picked_at)
            requests = [r for r in requests if r.request_id not in hits]
        served = _Served()
        search_started = time.perf_counter()
        groups: dict[tuple[str, str | None, SearchKnobs, str], list[RetrieveRequest]] = defaultdict(list)
        for r in requests:
            if self.mode(r) != "lexical" and r.query in unencoded:
                events.append((r.request_id, FAILED))
            else:
                groups[(r.index, r.index_version, self._knobs(r), filter_key(r.filter))].append(r)
        for (index_name, version, knobs, _), group in groups.items():
            try:
                self._serve_group(served, index_name, version, knobs, group, vectors, row_of)
            except REDIS_UNREACHABLE:
                raise  # no request's fault: the whole batch goes back to its queue
            except Exception:
                # Each request alone: only those that fail on their own are failed.
                log.warning("a group of %d requests on %r failed; each tried alone", len(group), index_name)
                for r in group:
                    try:
                        self._serve_group(served, index_name, version, knobs, [r], vectors, row_of)
                    except Exception:
                        log.exception("retrieval of request %s (index %r) failed", r.request_id, index_name)
                        events.append((r.request_id, FAILED))
        events += served.events
        ranked = served.ranked
        search_s = time.perf_counter() - search_started
        metrics.SEARCH_SECONDS.observe(search_s)
        if tracing.active():
            tracing.record_perf("ragline.retrieve.search", search_started, search_started + search_s)
        if self._reranker is not None and ranked:
            ranked = self._rerank_each(ranked, events)
        retrieval_ms = (time.perf_counter() - started) * 1000

        to_generate: list[GenerateTask] = []
        for item in ranked:
            try:
                answered = self._answer(item, picked_at, retrieval_ms)
            except REDIS_UNREACHABLE:
                raise
            except Exception:
                log.exception("answering request %s failed", item.request.request_id)
                events.append((item.request.request_id, FAILED))
                continue
            events += answered[0]
            to_generate += answered[1]
        return Retrieved(events, to_generate, write_cache, served.deferred)

    def _encode(self, texts: list[str]) -> tuple[np.ndarray, Callable[[], None], set[str]]:
        """The batch's vectors (one encode), its cache write, and the texts that could not be
        encoded: when the whole batch fails, each text is encoded alone."""
        try:
            vectors, write = self._cache.encode_deferred(texts, self._embedder.encode)
            return vectors, write, set()
        except REDIS_UNREACHABLE:
            raise  # the cache's Redis: the whole batch goes back to its queue
        except Exception:
            if len(texts) <= 1:
                log.exception("encoding the batch's query failed")
                return np.zeros((len(texts), self._embedder.dim), dtype=np.float32), _nothing, set(texts)
        log.warning("encoding a batch of %d queries failed; each encoded alone", len(texts), exc_info=True)
        vectors = np.zeros((len(texts), self._embedder.dim), dtype=np.float32)
        writes: list[Callable[[], None]] = []
        unencoded: set[str] = set()
        for i, text in enumerate(texts):
            try:
                one, write = self._cache.encode_deferred([text], self._embedder.encode)
            except Exception:
                log.exception("encoding one query failed")
                unencoded.add(text)
                continue
            vectors[i] = one[0]
            writes.append(write)

        def write_all() -> None:
            for write in writes:
                write()

        return vectors, write_all, unencoded

    def _serve_group(
        self,
        served: _Served,
        index_name: str,
        version: str | None,
        knobs: SearchKnobs,
        group: list[RetrieveRequest],
        vectors: np.ndarray,
        row_of: dict[str, int],
    ) -> None:
        """One group's searches (one index, version, knobs and filter) into ``served``; raises
        when they fail, leaving ``served`` as it was."""
        if (shard := shard_names.split_shard(index_name)) is not None:
            # A shard answers for part of its index only, and the worker that took the batch may
            # be meant to hold no shard: never loaded, nor searched, on a query's say.
            message = f"{index_name!r} is a shard of index {shard[0]!r}, not an index: query {shard[0]!r}"
            served.events += [(r.request_id, Error(status=404, message=message)) for r in group]
            return
        sharded = self._shards.sharded(index_name, version=version) if self._shards is not None else None
        if self._shards is not None and sharded is not None:
            gathered = self._shards.search(
                sharded,
                [(r.query, self.mode(r)) for r in group],
                lambda q: vectors[row_of[q]],
                self._depth(max(r.top_k for r in group)),
                knobs,
                group[0].filter,
            )
            if isinstance(gathered, Loading):  # a shard held here is loading its registered version
                served.deferred.append(Deferred(gathered, list(group)))
                return
            served.ranked += [
                _Ranked(
                    r,
                    gathered.info,
                    gathered.chunks,
                    gathered.candidates[(r.query, self.mode(r))],
                    gathered.missing,
                    stale=gathered.stale,
                )
                for r in group
            ]
            return
        try:
            serving = self.indexes.serving(index_name, version=version)
        except UnknownIndex:
            unknown = Error(status=404, message=f"unknown index {index_name!r}")
            served.events += [(r.request_id, unknown) for r in group]
            return
        if serving.loading is not None and serving.must_wait(version):
            served.deferred.append(Deferred(serving.loading, list(group)))
            return
        loaded = serving.loaded
        if loaded is None:  # its only version failed to load (logged where it was loaded)
            unavailable = Error(
                status=503, message=f"index {index_name!r} could not be loaded; try again later"
            )
            served.events += [(r.request_id, unavailable) for r in group]
            return
        per_request = self._search_group(loaded, group, vectors, row_of, knobs)
        # Its sources name the version searched, which the API compares with the one it saw
        # before caching (the named version may have failed to load, or been replaced).
        served.ranked += [
            _Ranked(r, loaded.info, loaded.chunks, candidates)
            for r, candidates in zip(group, per_request, strict=True)
        ]

    def _rerank_each(self, ranked: list[_Ranked], events: list[tuple[str, StreamEvent]]) -> list[_Ranked]:
        """The reranker over the whole batch; when it fails, over each request alone."""
        try:
            self._rerank(ranked)
            return ranked
        except Exception:
            log.warning("reranking a batch failed; each request reranked alone", exc_info=True)
        kept = []
        for item in ranked:
            try:
                self._rerank([item])
            except Exception:
                log.exception("reranking request %s failed", item.request.request_id)
                events.append((item.request.request_id, FAILED))
            else:
                kept.append(item)
        return kept

    def _answer(
        self, item: _Ranked, picked_at: float, retrieval_ms: float
    ) -> tuple[list[tuple[str, StreamEvent]], list[GenerateTask]]:
        """One request's events, and its generation task when it goes on to one."""
        events: list[tuple[str, StreamEvent]] = []
        to_generate: list[GenerateTask] = []
        r, info = item.request, item.info
        top = self._top(item)
        sources = [_source(item.chunks, c) for c in top]
        partial: dict[str, Any] = {"partial": bool(item.missing), "partial_shards": list(item.missing)}
        timings = Timings(queue_ms=max(0.0, (picked_at - r.enqueued_at) * 1000), retrieval_ms=retrieval_ms)
        version = None if item.stale else info.version
        events.append(
            (r.request_id, Sources(sources=sources, index_version=version, index=info.name, **partial))
        )
        if r.mode == "retrieval":
            # A request the API degraded to retrieval-only says so in its `done` event.
            degraded: dict[str, Any] = dict(r.degraded) if r.degraded is not None else {}
            events.append((r.request_id, Done(answer=None, timings=timings, **degraded, **partial)))
        elif self._early_exit(r, top[0] if top else None):
            best = sources[0]
            cited = Citation(
                marker=1, chunk_id=best.chunk_id, source=best.source, title=best.title, anchor=best.anchor
            )
            done = Done(answer=best.text, timings=timings, early_exit=True, citations=[cited], **partial)
            events.append((r.request_id, done))
        else:
            task = GenerateTask(
                request_id=r.request_id,
                query=r.query,
                sources=sources,
                timings=timings,
                enqueued_at=time.time(),  # set again when it is sent
                job_id=r.job_id,
                history=r.history,
                sampling=r.sampling,
                partial_shards=item.missing,
            )
            to_generate.append(task)
        return events, to_generate

    def _semantic_hits(
        self, requests: list[RetrieveRequest], vectors: np.ndarray, row_of: dict[str, int]
    ) -> dict[str, Hit]:
        """The requests the semantic cache answers (those whose API set a scope, and that were
        embedded: a lexical request has no embedding to look up with)."""
        assert self._semantic is not None
        probes = [
            Probe(r.request_id, r.semantic_scope, r.query, vectors[row_of[r.query]])
            for r in requests
            if r.semantic_scope and self.mode(r) != "lexical"
        ]
        try:
            return self._semantic.lookup(probes)
        except Exception:  # the cache is an optimisation: its failure costs a search, not an answer
            log.warning("semantic cache lookup failed; searching instead", exc_info=True)
            return {}

    def _search_group(
        self,
        loaded: LoadedIndex,
        group: list[RetrieveRequest],
        vectors: np.ndarray,
        row_of: dict[str, int],
        knobs: SearchKnobs,
    ) -> list[list[Candidate]]:
        """The group's searches (see :func:`search_loaded`), as deep as its deepest request needs."""
        found = search_loaded(
            loaded,
            [(r.query, self.mode(r)) for r in group],
            lambda q: vectors[row_of[q]],
            self._depth(max(r.top_k for r in group)),
            knobs,
            group[0].filter,
            self._settings,
        )
        return [found[(r.query, self.mode(r))] for r in group]

    def _rerank(self, ranked: list[_Ranked]) -> None:
        """One cross-encoder call for the whole batch: each query's first candidates re-scored
        and re-ordered, the rest left after them in their order."""
        assert self._reranker is not None
        depth = self._settings.reranker_candidates
        pairs = [
            (item.request.query, item.chunks[c.row].embed_text)
            for item in ranked
            for c in item.candidates[:depth]
        ]
        started = time.perf_counter()
        scores = iter(self._reranker.score(pairs))
        log.debug("reranked %d pairs in %.1f ms", len(pairs), (time.perf_counter() - started) * 1000)
        for item in ranked:
            head = [Candidate(c.row, float(next(scores)), c.dense) for c in item.candidates[:depth]]
            head.sort(key=lambda c: -c.score)
            item.candidates = head + item.candidates[depth:]

    def _top(self, item: _Ranked) -> list[Candidate]:
        s, r = self._settings, item.request
        if not r.diversity:
            return item.candidates[: r.top_k]
        return diversify(
            item.candidates,
            item.chunks,
            r.top_k,
            per_section=s.max_chunks_per_section,
            per_file=s.max_chunks_per_file,
        )


def _semantic_answer(
    request: RetrieveRequest, hit: Hit, *, started: float, picked_at: float
) -> list[tuple[str, StreamEvent]]:
    """A request's events when an earlier question's answer answers it: that answer's sources,
    then its `done`, marked, with this request's own timings (and its degradation, if any)."""
    cached = hit.answer
    timings = Timings(
        queue_ms=max(0.0, (picked_at - request.enqueued_at) * 1000),
        retrieval_ms=(time.perf_counter() - started) * 1000,
    )
    degraded: dict[str, Any] = dict(request.degraded) if request.degraded is not None else {}
    match = SemanticMatch(question=hit.question, similarity=hit.similarity)
    done = Done.from_done(cached, timings=timings, cached="semantic", semantic_match=match, **degraded)
    sources = Sources(sources=cached.sources, index_version=request.index_version, index=request.index)
    return [(request.request_id, sources), (request.request_id, done)]


def _nothing() -> None:
    pass


def _source(chunks: Sequence[Chunk], candidate: Candidate) -> Source:
    c = chunks[candidate.row]
    return Source(
        chunk_id=c.chunk_id,
        source=c.source,
        title=c.title,
        text=c.text,
        score=candidate.score,
        anchor=c.anchor,
    )
