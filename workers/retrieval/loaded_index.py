"""A version of an index in memory, searched: one faiss call per batch of query vectors, with
a metadata filter's rows searched exactly or through the graph (``allowed``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import faiss
import numpy as np
from ragline.broker.contract.messages import MetadataFilter
from ragline.broker.contract.records import IndexInfo
from ragline.workers.retrieval.chunking import Chunk
from ragline.workers.retrieval.filter_rows import FilterCache, filter_rows
from ragline.workers.retrieval.lexical import LexicalIndex

# A filter letting through at most this many rows is searched exactly over them (a copy of their
# vectors per search); more, and the HNSW graph is searched with an ID selector.
EXACT_FILTER_MAX_ROWS = 8192


# Index types whose search takes IVF parameters (nprobe, refine factor).
IVF_TYPES = ("ivfpq", "ivfpq-disk")


@dataclass(frozen=True, slots=True)
class SearchKnobs:
    """Per-search effort: HNSW's efSearch, IVF's nprobe and refine factor (None: the index's own)."""

    ef_search: int | None = None
    nprobe: int | None = None
    refine_k_factor: float = 4.0


@dataclass(slots=True)
class LoadedIndex:
    info: IndexInfo
    index: faiss.Index
    chunks: list[Chunk]
    lexical: LexicalIndex | None = None
    # Where its filters' rows are kept: the worker's one budget (IndexCache sets it), else its own.
    filter_cache: FilterCache = field(default_factory=FilterCache)

    def _params(self, knobs: SearchKnobs) -> faiss.SearchParameters | None:
        return search_parameters(self.info.index_type, knobs)

    def search_rows(
        self,
        vectors: np.ndarray,
        top_k: int,
        knobs: SearchKnobs = SearchKnobs(),
        *,
        allowed: np.ndarray | None = None,
    ) -> list[list[tuple[int, float]]]:
        """One faiss call for the whole batch of query vectors: each one's (row, cosine) best
        first; with ``allowed`` (row ids) only those rows, and as many as asked when they exist."""
        if allowed is not None:
            return self._search_allowed(vectors, top_k, knobs, allowed)
        k = min(top_k, len(self.chunks))
        params = self._params(knobs)
        scores, ids = (
            self.index.search(vectors, k, params=params) if params else self.index.search(vectors, k)
        )
        return _rows(ids, scores)

    def _search_allowed(
        self, vectors: np.ndarray, top_k: int, knobs: SearchKnobs, allowed: np.ndarray
    ) -> list[list[tuple[int, float]]]:
        k = min(top_k, len(allowed))
        if k == 0:
            return [[] for _ in range(len(vectors))]
        stored = _flat_vectors(self.index)
        if (
            stored is not None
            and len(allowed) > EXACT_FILTER_MAX_ROWS
            and isinstance(self.index, faiss.IndexHNSW)
        ):
            # Many rows pass: the graph, told which. A search that still comes back short (the
            # graph walk met too few rows that pass) is done again exactly.
            selector = faiss.IDSelectorBatch(allowed)
            ef = max(knobs.ef_search or self.index.hnsw.efSearch, 2 * k)
            scores, ids = self.index.search(
                vectors, k, params=faiss.SearchParametersHNSW(sel=selector, efSearch=ef)
            )
            rows = _rows(ids, scores)
            short = [i for i, row in enumerate(rows) if len(row) < k]
            if short:
                for i, row in zip(short, _exact(vectors[short], stored, allowed, k), strict=True):
                    rows[i] = row
            return rows
        if stored is not None:
            # Exact over the rows that pass: a graph search restricted by a selector can stop
            # short of k results when few rows pass.
            return _exact(vectors, stored, allowed, k)
        # IVF: a selector, over every list, so that each row that passes can be found.
        selector = faiss.IDSelectorBatch(allowed)
        ivf = faiss.SearchParametersIVF(sel=selector, nprobe=faiss.extract_index_ivf(self.index).nlist)
        params = faiss.IndexRefineSearchParameters(k_factor=knobs.refine_k_factor, base_index_params=ivf)
        params.sel = selector
        scores, ids = self.index.search(vectors, k, params=params)
        return _rows(ids, scores)

    def filter_rows(self, flt: MetadataFilter) -> np.ndarray:
        """The rows ``flt`` lets through (see ``filter_rows.py``), kept while the budget allows."""
        return filter_rows(self.filter_cache, self.info.name, self.info.version, self.chunks, flt)

    def search(
        self, vectors: np.ndarray, top_k: int, knobs: SearchKnobs = SearchKnobs()
    ) -> list[list[tuple[Chunk, float]]]:
        """Like :meth:`search_rows`, with the chunks themselves."""
        return [[(self.chunks[i], s) for i, s in row] for row in self.search_rows(vectors, top_k, knobs)]


def search_parameters(index_type: str, knobs: SearchKnobs) -> faiss.SearchParameters | None:
    """What a search of an index of ``index_type`` passes faiss for ``knobs`` (None: its defaults)."""
    if index_type == "hnsw" and knobs.ef_search:
        return faiss.SearchParametersHNSW(efSearch=knobs.ef_search)
    if index_type in IVF_TYPES:
        base = faiss.SearchParametersIVF(nprobe=knobs.nprobe) if knobs.nprobe else None
        return faiss.IndexRefineSearchParameters(k_factor=knobs.refine_k_factor, base_index_params=base)
    return None


def _exact(
    vectors: np.ndarray, stored: np.ndarray, allowed: np.ndarray, k: int
) -> list[list[tuple[int, float]]]:
    scores = vectors @ stored[allowed].T
    best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return _rows(allowed[best], np.take_along_axis(scores, best, axis=1))


def _rows(ids: np.ndarray, scores: np.ndarray) -> list[list[tuple[int, float]]]:
    return [
        [(int(i), float(s)) for i, s in zip(row_ids, row_scores, strict=True) if i >= 0]
        for row_ids, row_scores in zip(ids, scores, strict=True)
    ]


def _flat_vectors(index: faiss.Index) -> np.ndarray | None:
    """The vectors an HNSW-flat or flat index stores, as a view (no copy), else None."""
    storage = faiss.downcast_index(index.storage) if isinstance(index, faiss.IndexHNSW) else index
    if not isinstance(storage, faiss.IndexFlat):
        return None
    return faiss.rev_swig_ptr(storage.get_xb(), storage.ntotal * storage.d).reshape(storage.ntotal, storage.d)


def stored_vectors(index: faiss.Index) -> np.ndarray | None:
    """A copy of the exact vectors an HNSW-flat or flat index holds, row i the i-th chunk's; None
    for an index that keeps only codes (IVF-PQ: its vectors must be embedded again)."""
    stored = _flat_vectors(index)
    return None if stored is None else np.array(stored, copy=True)
