"""One retrieval batch: one embedding call and one FAISS search per index for many queries."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import faiss

from broker import metrics
from broker.contract import Done, Error, GenerateTask, RetrieveRequest, Source, Sources, StreamEvent, Timings
from broker.settings import Settings
from workers.retrieval.embedder import Embedder
from workers.retrieval.embedding_cache import EmbeddingCache
from workers.retrieval.index_store import IndexCache, SearchKnobs, UnknownIndex

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Retrieved:
    """What a batch produced: (request id, event) to write, and the generation tasks to send."""

    events: list[tuple[str, StreamEvent]]
    to_generate: list[GenerateTask]
    # The embedding-cache write, for after the answers are out (it is not on their path).
    write_cache: Callable[[], None]


class BatchRetriever:
    def __init__(
        self, settings: Settings, embedder: Embedder, cache: EmbeddingCache, indexes: IndexCache
    ) -> None:
        self._settings = settings
        self._embedder = embedder
        self._cache = cache
        self.indexes = indexes
        faiss.cvar.distance_compute_blas_threshold = settings.faiss_blas_threshold

    def embed_warm_up(self) -> None:
        """The first encode pays for lazy initialisation; pay it before taking work."""
        self._embedder.encode(["warm up"])

    def _knobs(self, request: RetrieveRequest) -> SearchKnobs:
        return SearchKnobs(
            ef_search=request.ef_search,
            nprobe=request.nprobe,
            refine_k_factor=self._settings.ivf_refine_k_factor,
        )

    def _early_exit(self, request: RetrieveRequest, sources: list[Source]) -> bool:
        """Answer with the best source, skipping generation, when it clears the threshold and the
        request allows it (off unless RAGLINE_EARLY_EXIT_SCORE is set)."""
        threshold = self._settings.early_exit_score
        return bool(threshold > 0 and sources and request.allow_early_exit and sources[0].score >= threshold)

    def run(self, requests: list[RetrieveRequest], *, picked_at: float) -> Retrieved:
        events: list[tuple[str, StreamEvent]] = []
        to_generate: list[GenerateTask] = []
        metrics.COALESCED_BATCH.observe(len(requests))
        for r in requests:
            metrics.QUEUE_WAIT_SECONDS.labels("retrieval").observe(max(0.0, picked_at - r.enqueued_at))

        started = time.perf_counter()
        texts = sorted({r.query for r in requests})
        vectors, write_cache = self._cache.encode_deferred(texts, self._embedder.encode)
        row_of = {t: i for i, t in enumerate(texts)}
        embed_s = time.perf_counter() - started
        metrics.EMBED_SECONDS.observe(embed_s)

        groups: dict[tuple[str, str | None, SearchKnobs], list[RetrieveRequest]] = defaultdict(list)
        for r in requests:
            groups[(r.index, r.index_version, self._knobs(r))].append(r)
        for (index_name, version, knobs), group in groups.items():
            try:
                loaded = self.indexes.get(index_name, version=version)
            except UnknownIndex:
                unknown = Error(status=404, message=f"unknown index {index_name!r}")
                events += [(r.request_id, unknown) for r in group]
                continue
            search_started = time.perf_counter()
            rows = vectors[[row_of[r.query] for r in group]]
            hits = loaded.search(rows, max(r.top_k for r in group), knobs)
            search_s = time.perf_counter() - search_started
            metrics.SEARCH_SECONDS.observe(search_s)
            for r, found in zip(group, hits, strict=True):
                sources = [
                    Source(chunk_id=c.chunk_id, source=c.source, title=c.title, text=c.text, score=score)
                    for c, score in found[: r.top_k]
                ]
                timings = Timings(
                    queue_ms=max(0.0, (picked_at - r.enqueued_at) * 1000),
                    retrieval_ms=(embed_s + search_s) * 1000,
                )
                events.append((r.request_id, Sources(sources=sources, index_version=loaded.info.version)))
                if r.mode == "retrieval":
                    # A request the API degraded to retrieval-only says so in its `done` event.
                    degraded = dict(r.degraded) if r.degraded is not None else {}
                    events.append((r.request_id, Done(answer=None, timings=timings, **degraded)))
                elif self._early_exit(r, sources):
                    done = Done(answer=sources[0].text, timings=timings, early_exit=True)
                    events.append((r.request_id, done))
                else:
                    task = GenerateTask(
                        request_id=r.request_id,
                        query=r.query,
                        sources=sources,
                        timings=timings,
                        enqueued_at=time.time(),  # set again when it is sent
                        job_id=r.job_id,
                    )
                    to_generate.append(task)
        return Retrieved(events, to_generate, write_cache)
