"""Ranking a query's candidates: metadata filters, reciprocal-rank fusion, diversity caps."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from ragline.broker.contract.messages import MetadataFilter, PrefixMatch
from ragline.workers.retrieval.chunking import Chunk


@dataclass(frozen=True, slots=True)
class Candidate:
    row: int
    score: float
    # The query's cosine similarity to it when the dense search found it (early exit reads it).
    dense: float | None = None


def search_depth(candidates: int, top_k: int) -> int:
    """How many candidates a search for ``top_k`` results fetches: ``candidates``
    (RAGLINE_RETRIEVAL_CANDIDATES), and at least twice ``top_k``, so fusion, the reranker and the
    diversity caps have more than the answer to choose from."""
    return max(candidates, 2 * top_k)


def field_value(chunk: Chunk, key: str) -> str | None:
    """What a filter on ``key`` compares: the chunk's title path, or its metadata value."""
    if key == "title":
        return chunk.title
    return chunk.meta.get(key)


def matches(chunk: Chunk, flt: MetadataFilter) -> bool:
    for key, wanted in flt.items():
        value = field_value(chunk, key)
        if value is None:
            return False
        if isinstance(wanted, PrefixMatch):
            if not value.startswith(wanted.prefix):
                return False
        elif isinstance(wanted, list):
            if value not in wanted:
                return False
        elif value != wanted:
            return False
    return True


def allowed_rows(chunks: Sequence[Chunk], flt: MetadataFilter) -> np.ndarray:
    """The rows ``flt`` lets through, chunk by chunk: what ``filter_rows`` computes from columns."""
    return np.fromiter((i for i, c in enumerate(chunks) if matches(c, flt)), dtype=np.int64)


def fuse(
    dense: Sequence[tuple[int, float]],
    lexical: Sequence[tuple[int, float]],
    *,
    rrf_k: float,
    dense_weight: float,
    lexical_weight: float,
) -> list[Candidate]:
    """Reciprocal-rank fusion: each list gives weight / (rrf_k + rank) to what it found."""
    score: dict[int, float] = {}
    for weight, ranked in ((dense_weight, dense), (lexical_weight, lexical)):
        for rank, (row, _) in enumerate(ranked, start=1):
            score[row] = score.get(row, 0.0) + weight / (rrf_k + rank)
    cosine = dict(dense)
    order = sorted(score, key=lambda r: (-score[r], r))
    return [Candidate(r, score[r], cosine.get(r)) for r in order]


def diversify(
    candidates: Sequence[Candidate],
    chunks: Sequence[Chunk],
    top_k: int,
    *,
    per_section: int,
    per_file: int,
) -> list[Candidate]:
    """The best ``top_k`` with at most ``per_section`` chunks of one section and ``per_file`` of
    one file (0: no cap). Candidates past a cap fill in, in rank order, only when too few remain,
    so a request still gets ``top_k`` results from a small or narrowly filtered index."""
    picked: list[Candidate] = []
    passed: list[Candidate] = []
    sections: Counter[tuple[str, str]] = Counter()
    files: Counter[str] = Counter()
    for c in candidates:
        if len(picked) == top_k:
            break
        chunk = chunks[c.row]
        section, file = chunk.section_key, chunk.source
        if (per_section and sections[section] >= per_section) or (per_file and files[file] >= per_file):
            passed.append(c)
            continue
        picked.append(c)
        sections[section] += 1
        files[file] += 1
    if len(picked) < top_k:
        rank = {c.row: i for i, c in enumerate(candidates)}
        picked = sorted(picked + passed[: top_k - len(picked)], key=lambda c: rank[c.row])
    return picked
