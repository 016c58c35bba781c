"""bench/scale/run.py's corpora: clustered unit vectors made block by block from a seed, held-out
queries from the same distribution, and their exact top-k by brute force over every block.

A vector is a cluster's centre plus Gaussian noise, normalised. The noise's variance falls off
as 1/(rank + 1) along a random orthonormal basis, as the spectrum of sentence embeddings does,
so the clusters have a few dozen effective dimensions rather than all 384 (isotropic noise
would make every neighbour search a worst case no real corpus is). Any block can be made
again alone from the seed, so nothing ever holds more than one block of the corpus.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import faiss
import numpy as np

BLOCK = 100_000  # vectors made (and added, and searched exactly) at a time: 150 MB at 384-d
_EXACT_GROUP = 256  # queries scored against a block at once: 100 MB of similarities
_CORPUS, _QUERIES = 0, 1  # the seed streams the corpus' blocks and the queries are drawn from


@dataclass(frozen=True)
class Corpus:
    n: int
    dim: int = 384
    clusters: int = 1000
    # The noise's norm relative to the (unit) centre's, before normalising.
    spread: float = 1.0
    seed: int = 0

    @property
    def key(self) -> str:
        """Names what the corpus is, for the caches."""
        return f"n{self.n}-d{self.dim}-c{self.clusters}-s{self.spread:g}-seed{self.seed}"

    @cached_property
    def _shape(self) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        centres = rng.standard_normal((self.clusters, self.dim), dtype=np.float32)
        centres /= np.linalg.norm(centres, axis=1, keepdims=True)
        basis, _ = np.linalg.qr(rng.standard_normal((self.dim, self.dim)))
        scales = 1 / np.sqrt(np.arange(1, self.dim + 1))
        scales *= self.spread / np.linalg.norm(scales)
        # Rows: the noise's directions, each scaled by its standard deviation.
        return centres, np.ascontiguousarray(scales[:, None] * basis.T, dtype=np.float32)

    def _draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        centres, noise_basis = self._shape
        x = centres[rng.integers(0, self.clusters, count)]
        x += rng.standard_normal((count, self.dim), dtype=np.float32) @ noise_basis
        faiss.normalize_L2(x)
        return x

    def block(self, i: int) -> np.ndarray:
        """Rows ``i·BLOCK`` up to the next block's (or the end)."""
        count = min(BLOCK, self.n - i * BLOCK)
        return self._draw(np.random.default_rng([self.seed, _CORPUS, i]), count)

    def blocks(self) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, rows) for every block, in order."""
        for i in range(-(-self.n // BLOCK)):
            yield i * BLOCK, self.block(i)

    def head(self, count: int) -> np.ndarray:
        """The first ``count`` rows: the rows are drawn independently, so a random sample too."""
        parts, have = [], 0
        for _, rows in self.blocks():
            if have >= count:
                break
            parts.append(rows[: count - have])
            have += len(parts[-1])
        return np.concatenate(parts)

    def queries(self, count: int) -> np.ndarray:
        """Vectors from the same clusters, none of them in the corpus."""
        return self._draw(np.random.default_rng([self.seed, _QUERIES]), count)


def exact_top_k(corpus: Corpus, queries: np.ndarray, k: int) -> np.ndarray:
    """Each query's ``k`` nearest rows by inner product, over the whole corpus, block by block."""
    heap = faiss.ResultHeap(len(queries), k, keep_max=True)
    for first, rows in corpus.blocks():
        # One matrix product per group of queries (faiss.knn is several times slower here).
        scores = np.empty((len(queries), k), dtype=np.float32)
        ids = np.empty((len(queries), k), dtype=np.int64)
        for q in range(0, len(queries), _EXACT_GROUP):
            sims = queries[q : q + _EXACT_GROUP] @ rows.T
            best = np.argpartition(-sims, k, axis=1)[:, :k]
            scores[q : q + _EXACT_GROUP] = np.take_along_axis(sims, best, axis=1)
            ids[q : q + _EXACT_GROUP] = best + first
        heap.add_result(scores, ids)
    heap.finalize()
    return heap.I


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    """The share of the true top-k that each search found, averaged over the queries."""
    k = truth.shape[1]
    hits = sum(len(set(f[:k].tolist()) & set(t.tolist())) for f, t in zip(found, truth, strict=True))
    return hits / truth.size
