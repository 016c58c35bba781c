"""The semantic cache's lookup, where the query's embedding already is: in the retrieval batch,
after the encode and before the search (the store in Redis: :mod:`ragline.broker.state.semantic_cache`).

Each scope's questions are an HNSW in this process (inner product of normalised embeddings: the
cosine similarity), brought up to date from the scope's stream before each lookup (the entries
after the last one held: one pipelined round trip for every scope of a batch). A request whose
nearest earlier question is at least ``threshold`` similar is answered with that question's
answer, when the result cache still holds it; every other probe is a miss, proposed as an entry
for the API to remember once its own answer is stored.

HNSW cannot remove a vector: a scope held here grows with its stream and is read again whole
once it holds twice the stream's cap (the stream has dropped its oldest entries by then), or
dropped when the stream is gone. At most ``loaded_scopes`` are held, least recently used out
first.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from ragline.broker import metrics
from ragline.broker.contract.messages import CachedAnswer, ContractError
from ragline.broker.state.semantic_cache import Entry, Pending, ScopeRead
from ragline.workers.retrieval.index_builders import HnswParams, empty_hnsw

log = logging.getLogger(__name__)


class Store(Protocol):
    """What the lookup needs of :class:`ragline.broker.state.semantic_cache.SemanticStore`."""

    def read(self, after: dict[str, str]) -> dict[str, ScopeRead]: ...
    def answers(self, answer_keys: Sequence[str]) -> list[bytes | None]: ...
    def propose(self, misses: Sequence[Pending]) -> None: ...


@dataclass(frozen=True, slots=True)
class Probe:
    """One request's question, its embedding (normalised) and the scope it may be answered from."""

    request_id: str
    scope: str
    question: str
    vector: np.ndarray


@dataclass(frozen=True, slots=True)
class Hit:
    question: str  # the earlier question whose answer this is
    similarity: float
    answer: CachedAnswer


class ScopeIndex:
    """One scope's questions, as this process holds them."""

    def __init__(self, dim: int, params: HnswParams) -> None:
        self._index = empty_hnsw(dim, params)
        self._dim = dim
        self.questions: list[str] = []
        self.answer_keys: list[str] = []
        self.last_id = ""  # the last stream entry held ('' for none)

    def __len__(self) -> int:
        return len(self.questions)

    def add(self, entries: Sequence[Entry]) -> None:
        usable = [e for e in entries if len(e.vector) == 4 * self._dim]
        if usable:
            vectors = np.stack([np.frombuffer(e.vector, dtype=np.float32) for e in usable])
            self._index.add(vectors)
            self.questions += [e.question for e in usable]
            self.answer_keys += [e.answer_key for e in usable]
        if entries:
            self.last_id = entries[-1].id

    def nearest(self, vectors: np.ndarray) -> list[tuple[int, float]]:
        """Each vector's nearest question: (its row, the similarity); (-1, -inf) when none."""
        return [found[0] for found in self.search(vectors, 1)]

    def search(self, vectors: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
        """Each vector's ``k`` nearest questions, nearest first, padded with (-1, -inf)."""
        if not self.questions:
            return [[(-1, float("-inf"))] * k for _ in range(len(vectors))]
        scores, rows = self._index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)
        return [
            [(int(r), float(s) if r >= 0 else float("-inf")) for s, r in zip(score, row, strict=True)]
            for score, row in zip(scores, rows, strict=True)
        ]


class SemanticCache:
    def __init__(
        self,
        store: Store,
        *,
        dim: int,
        threshold: float,
        hnsw: HnswParams,
        scope_max_entries: int,
        loaded_scopes: int,
    ) -> None:
        self._store = store
        self._dim = dim
        self.threshold = threshold
        self._hnsw = hnsw
        self._scope_max = scope_max_entries
        self._loaded_max = max(1, loaded_scopes)
        self._scopes: OrderedDict[str, ScopeIndex] = OrderedDict()

    def lookup(self, probes: Sequence[Probe]) -> dict[str, Hit]:
        """The probes answered from the cache, by request id; the rest are proposed as entries."""
        if not probes:
            return {}
        scopes = self._refresh({p.scope for p in probes})
        candidates: list[tuple[Probe, str, float, str]] = []  # probe, question, similarity, answer key
        misses: list[Probe] = []
        for scope_id, index in scopes.items():
            mine = [p for p in probes if p.scope == scope_id]
            found = index.nearest(np.stack([p.vector for p in mine]))
            for probe, (row, similarity) in zip(mine, found, strict=True):
                if row >= 0 and similarity >= self.threshold:
                    candidates.append((probe, index.questions[row], similarity, index.answer_keys[row]))
                else:
                    misses.append(probe)
        hits: dict[str, Hit] = {}
        bodies = self._store.answers([key for *_, key in candidates])
        for (probe, question, similarity, _), body in zip(candidates, bodies, strict=True):
            answer = _decoded(body)
            if answer is None:  # the result cache has let it go: computed again, remembered again
                misses.append(probe)
            else:
                hits[probe.request_id] = Hit(question, similarity, answer)
        metrics.CACHE_HITS.labels("semantic").inc(len(hits))
        metrics.CACHE_MISSES.labels("semantic").inc(len(misses))
        self._store.propose(
            [
                Pending(p.request_id, p.scope, p.question, np.asarray(p.vector, dtype=np.float32).tobytes())
                for p in misses
            ]
        )
        return hits

    def _refresh(self, wanted: set[str]) -> dict[str, ScopeIndex]:
        """The wanted scopes, each up to date with its stream (one round trip for all)."""
        held = {s: self._scopes.get(s) for s in wanted}
        # A scope grown to twice the stream's cap is read again whole (see the module docstring).
        for scope, index in held.items():
            if index is not None and len(index) >= 2 * self._scope_max:
                held[scope] = None
        read = self._store.read({s: index.last_id if index is not None else "" for s, index in held.items()})
        fresh: dict[str, ScopeIndex] = {}
        for scope in sorted(wanted):
            index = held[scope]
            if not read[scope].exists:
                self._scopes.pop(scope, None)
                index = ScopeIndex(self._dim, self._hnsw)  # empty: every probe of it misses
            else:
                if index is None:
                    index = ScopeIndex(self._dim, self._hnsw)
                index.add(read[scope].entries)
                self._scopes[scope] = index
                self._scopes.move_to_end(scope)
            fresh[scope] = index
        while len(self._scopes) > self._loaded_max:
            self._scopes.popitem(last=False)
        return fresh


def _decoded(body: bytes | None) -> CachedAnswer | None:
    if body is None:
        return None
    try:
        return CachedAnswer.decode(body)
    except ContractError:  # written by another release: as if it were gone
        log.warning("a cached answer did not decode; computing it again", exc_info=True)
        return None
