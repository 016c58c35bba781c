"""The lexical index: BM25 over the chunks' title paths and text (bm25s: sparse matrices, numpy).

Built at ingest beside FAISS and saved in the same version folder, so the two are swapped
together. Words are lower-cased, English stop words dropped and Snowball-stemmed; identifiers
keep their underscores (``__init__``, ``lru_cache``). Why bm25s: docs/performance.md
("retrieval quality").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)
# bm25s logs every index build and load at DEBUG on a logger of its own level.
logging.getLogger("bm25s").setLevel(logging.WARNING)


def _tokenizer() -> Any:  # a bm25s Tokenizer
    import Stemmer
    from bm25s.tokenization import Tokenizer

    return Tokenizer(stopwords="en", stemmer=Stemmer.Stemmer("english").stemWord)


class LexicalIndex:
    # bm25s ships no types: its retriever and tokenizer are Any here.
    def __init__(self, retriever: Any, tokenizer: Any, size: int) -> None:
        self._retriever = retriever
        self._tokenizer = tokenizer
        self.size = size

    @classmethod
    def build(cls, texts: Sequence[str]) -> LexicalIndex:
        import bm25s

        tokenizer = _tokenizer()
        tokens = tokenizer.tokenize(list(texts), update_vocab=True, return_as="tuple", show_progress=False)
        retriever = bm25s.BM25()
        retriever.index(tokens, show_progress=False)
        return cls(retriever, tokenizer, len(texts))

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self._retriever.save(str(folder), show_progress=False)
        self._tokenizer.save_vocab(str(folder))

    @classmethod
    def load(cls, folder: Path, size: int) -> LexicalIndex:
        import bm25s

        retriever = bm25s.BM25.load(str(folder), show_progress=False)
        tokenizer = _tokenizer()
        tokenizer.load_vocab(str(folder))
        return cls(retriever, tokenizer, size)

    def search(
        self, queries: Sequence[str], k: int, *, allowed: np.ndarray | None = None
    ) -> list[list[tuple[int, float]]]:
        """One BM25 call for the whole batch: each query's (row, score) best first, only rows
        matching at least one of its words (and in ``allowed``, a row-id array, when given)."""
        k = min(k, self.size)
        if not queries or k < 1:
            return [[] for _ in queries]
        tokens = self._tokenizer.tokenize(
            list(queries), update_vocab=False, return_as="string", show_progress=False
        )
        mask = None
        if allowed is not None:
            mask = np.zeros(self.size, dtype=np.float32)
            mask[allowed] = 1.0
        rows, scores = self._retriever.retrieve(
            tokens, k=k, show_progress=False, weight_mask=mask, n_threads=1
        )
        return [
            [(int(i), float(s)) for i, s in zip(row, row_scores, strict=True) if s > 0]
            for row, row_scores in zip(rows, scores, strict=True)
        ]
