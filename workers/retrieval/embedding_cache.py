"""Level-2 cache: text → embedding (float32 bytes) in Redis, shared by workers and ingestion."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np
import redis

from broker import metrics
from broker.keys import Keys

Encode = Callable[[Sequence[str]], np.ndarray]


class EmbeddingCache:
    def __init__(self, client: redis.Redis, keys: Keys, *, model_id: str, dim: int, ttl_s: int) -> None:
        self._client = client
        self._keys = keys
        self._model_id = model_id
        self._dim = dim
        self._ttl_s = ttl_s

    def _key(self, text: str) -> str:
        digest = hashlib.sha1(f"{self._model_id}\x1f{text}".encode()).hexdigest()
        return self._keys.embedding(digest)

    def encode(self, texts: Sequence[str], encode: Encode) -> np.ndarray:
        """Embeddings for ``texts``: one MGET, one ``encode`` call for the misses, one pipelined write."""
        vectors, write = self.encode_deferred(texts, encode)
        write()
        return vectors

    def encode_deferred(self, texts: Sequence[str], encode: Encode) -> tuple[np.ndarray, Callable[[], None]]:
        """As :meth:`encode`, with the cache write left to the caller (to do once its answers are out)."""
        if not texts:
            return np.empty((0, self._dim), dtype=np.float32), _nothing
        keys = [self._key(t) for t in texts]
        cached = self._client.mget(keys)
        out = np.empty((len(texts), self._dim), dtype=np.float32)
        missing = [i for i, raw in enumerate(cached) if raw is None or len(raw) != 4 * self._dim]
        for i, raw in enumerate(cached):
            if raw is not None and len(raw) == 4 * self._dim:
                out[i] = np.frombuffer(raw, dtype=np.float32)
        metrics.CACHE_HITS.labels("embedding").inc(len(texts) - len(missing))
        metrics.CACHE_MISSES.labels("embedding").inc(len(missing))
        if not missing:
            return out, _nothing
        fresh = encode([texts[i] for i in missing])
        for row, i in enumerate(missing):
            out[i] = fresh[row]

        def write() -> None:
            pipe = self._client.pipeline(transaction=False)
            for i in missing:
                pipe.set(keys[i], out[i].tobytes(), ex=self._ttl_s)
            pipe.execute()

        return out, write


def _nothing() -> None:
    return None
