"""One retrieval batch: one embedding call, and per index one FAISS search and one BM25 search,
for many queries; then per query fusion, the optional reranker, and the diversity caps."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import faiss
import numpy as np

from broker import metrics
from broker.contract import (
    Citation,
    Done,
    Error,
    GenerateTask,
    RetrieveRequest,
    Source,
    Sources,
    StreamEvent,
    Timings,
    filter_key,
)
from broker.indexes import IndexInfo
from broker.settings import RetrievalSettings
from workers.retrieval.chunking import Chunk
from workers.retrieval.embedder import Embedder
from workers.retrieval.embedding_cache import EmbeddingCache
from workers.retrieval.index_store import IndexCache, LoadedIndex, SearchKnobs, UnknownIndex
from workers.retrieval.rerank import Reranker
from workers.retrieval.search import Candidate, diversify, search_depth
from workers.retrieval.shard_search import ShardSearch, search_loaded

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Retrieved:
    """What a batch produced: (request id, event) to write, and the generation tasks to send."""

    events: list[tuple[str, StreamEvent]]
    to_generate: list[GenerateTask]
    # The embedding-cache write, for after the answers are out (it is not on their path).
    write_cache: Callable[[], None]


@dataclass(slots=True)
class _Ranked:
    request: RetrieveRequest
    info: IndexInfo
    # What the candidates' rows index: the index's chunks, or a sharded search's merged ones.
    chunks: Sequence[Chunk]
    candidates: list[Candidate]
    # The shards of a sharded index that did not answer.
    missing: tuple[str, ...] = ()


class BatchRetriever:
    def __init__(
        self,
        settings: RetrievalSettings,
        embedder: Embedder,
        cache: EmbeddingCache,
        indexes: IndexCache,
        reranker: Reranker | None = None,
        shards: ShardSearch | None = None,
    ) -> None:
        self._settings = settings
        self._embedder = embedder
        self._cache = cache
        self.indexes = indexes
        self._reranker = reranker
        self._shards = shards
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
        for r in requests:
            metrics.QUEUE_WAIT_SECONDS.labels("retrieval").observe(max(0.0, picked_at - r.enqueued_at))

        started = time.perf_counter()
        texts = sorted({r.query for r in requests if self.mode(r) != "lexical"})
        vectors, write_cache = self._cache.encode_deferred(texts, self._embedder.encode)
        row_of = {t: i for i, t in enumerate(texts)}
        embed_s = time.perf_counter() - started
        metrics.EMBED_SECONDS.observe(embed_s)

        events: list[tuple[str, StreamEvent]] = []
        ranked: list[_Ranked] = []
        search_started = time.perf_counter()
        groups: dict[tuple[str, str | None, SearchKnobs, str], list[RetrieveRequest]] = defaultdict(list)
        for r in requests:
            groups[(r.index, r.index_version, self._knobs(r), filter_key(r.filter))].append(r)
        for (index_name, version, knobs, _), group in groups.items():
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
                for r in group:
                    found = gathered.candidates[(r.query, self.mode(r))]
                    ranked.append(_Ranked(r, gathered.info, gathered.chunks, found, gathered.missing))
                continue
            try:
                loaded = self.indexes.get(index_name, version=version)
            except UnknownIndex:
                unknown = Error(status=404, message=f"unknown index {index_name!r}")
                events += [(r.request_id, unknown) for r in group]
                continue
            found = self._search_group(loaded, group, vectors, row_of, knobs)
            ranked += [
                _Ranked(r, loaded.info, loaded.chunks, candidates)
                for r, candidates in zip(group, found, strict=True)
            ]
        search_s = time.perf_counter() - search_started
        metrics.SEARCH_SECONDS.observe(search_s)
        if self._reranker is not None and ranked:
            self._rerank(ranked)
        retrieval_ms = (time.perf_counter() - started) * 1000

        to_generate: list[GenerateTask] = []
        for item in ranked:
            r, info = item.request, item.info
            top = self._top(item)
            sources = [_source(item.chunks, c) for c in top]
            partial = {"partial": bool(item.missing), "partial_shards": list(item.missing)}
            timings = Timings(
                queue_ms=max(0.0, (picked_at - r.enqueued_at) * 1000), retrieval_ms=retrieval_ms
            )
            events.append(
                (
                    r.request_id,
                    Sources(sources=sources, index_version=info.version, index=info.name, **partial),
                )
            )
            if r.mode == "retrieval":
                # A request the API degraded to retrieval-only says so in its `done` event.
                degraded = dict(r.degraded) if r.degraded is not None else {}
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
        return Retrieved(events, to_generate, write_cache)

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
