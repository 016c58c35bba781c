"""The optional reranking stage: a cross-encoder re-scores each query's first fused candidates.

Off unless ``RAGLINE_RERANKER_MODEL`` names a local sentence-transformers ``CrossEncoder``
folder: no cross-encoder's weights install from a package registry the way the embedding
model's do (docs/retrieval.md), and hubs are not reachable here. One ``predict`` call scores
every (query, passage) pair of a batch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from ragline.broker.config.settings import RetrievalSettings


class Reranker:
    def __init__(self, model_path: str, *, threads: int) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import CrossEncoder

        torch.set_num_threads(threads)
        self.model_path = model_path
        self._model = CrossEncoder(model_path, device="cpu")

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """One relevance score per (query, passage) pair, higher is better."""
        if not pairs:
            return []
        scores = np.asarray(self._model.predict(list(pairs), batch_size=64, show_progress_bar=False))
        if scores.ndim == 2:  # a classifier head with several labels: the last is "relevant"
            scores = scores[:, -1]
        return [float(s) for s in scores]


def reranker(settings: RetrievalSettings) -> Reranker | None:
    """The configured reranker, or None when there is none."""
    if not settings.reranker_model:
        return None
    return Reranker(settings.reranker_model, threads=settings.torch_threads)
