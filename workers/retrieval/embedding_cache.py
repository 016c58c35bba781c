"""Level-2 cache: text → embedding (float32 bytes) in Redis, shared by workers and ingestion.

Bounded by a TTL and an entry budget (least recently used out first; an entry costs about
``4 · dim`` bytes plus ~200 of key and index), and it gives way first near Redis' memory limit
(``broker/redis/memory_guard.py``): a write that is skipped costs one encode later, never an answer.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
import redis
from ragline.broker import metrics
from ragline.broker.config.settings import RetrievalSettings
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.memory_guard import MemoryGuard
from ragline.broker.redis.scripts import lua

Encode = Callable[[Sequence[str]], np.ndarray]
log = logging.getLogger(__name__)


class EmbeddingCache:
    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        *,
        model_id: str,
        dim: int,
        ttl_s: int,
        max_entries: int = 100_000,
        max_memory_fraction: float = 0.7,
    ) -> None:
        self._client = client
        self._keys = keys
        self._model_id = model_id
        self._dim = dim
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._guard = MemoryGuard(client, "embedding", max_fraction=max_memory_fraction)
        self._store = client.register_script(lua("ragline.broker.state", "bounded_cache_store"))

    @classmethod
    def for_settings(
        cls, client: redis.Redis, keys: Keys, settings: RetrievalSettings, *, model_id: str, dim: int
    ) -> EmbeddingCache:
        return cls(
            client,
            keys,
            model_id=model_id,
            dim=dim,
            ttl_s=settings.embedding_cache_ttl_s,
            max_entries=settings.embedding_cache_max_entries,
            max_memory_fraction=settings.cache_write_max_memory_fraction,
        )

    def _key(self, text: str) -> str:
        digest = hashlib.sha1(f"{self._model_id}\x1f{text}".encode()).hexdigest()
        return self._keys.embedding(digest)

    def encode(self, texts: Sequence[str], encode: Encode) -> np.ndarray:
        """Embeddings for ``texts``: one MGET, one ``encode`` call for the misses, one write."""
        vectors, write = self.encode_deferred(texts, encode)
        write()
        return vectors

    def encode_deferred(self, texts: Sequence[str], encode: Encode) -> tuple[np.ndarray, Callable[[], None]]:
        """As :meth:`encode`, with the cache write left to the caller (to do once its answers are out).
        The write never raises for a Redis short of memory: it drops the entries and counts them."""
        if not texts:
            return np.empty((0, self._dim), dtype=np.float32), _nothing
        keys = [self._key(t) for t in texts]
        cached = cast(list[bytes | None], self._client.mget(keys))  # not decoded: bytes
        out = np.empty((len(texts), self._dim), dtype=np.float32)
        missing = [i for i, raw in enumerate(cached) if raw is None or len(raw) != 4 * self._dim]
        hits = [keys[i] for i, raw in enumerate(cached) if raw is not None and len(raw) == 4 * self._dim]
        for i, raw in enumerate(cached):
            if raw is not None and len(raw) == 4 * self._dim:
                out[i] = np.frombuffer(raw, dtype=np.float32)
        metrics.CACHE_HITS.labels("embedding").inc(len(texts) - len(missing))
        metrics.CACHE_MISSES.labels("embedding").inc(len(missing))
        if missing:
            fresh = encode([texts[i] for i in missing])
            for row, i in enumerate(missing):
                out[i] = fresh[row]

        def write() -> None:
            # Hits are written too: their recency (and TTL) keeps the budget least-recently-used.
            if not self._guard.allows_write():
                self._guard.dropped("memory", len(missing))
                return
            fresh_rows = {keys[i]: out[i].tobytes() for i in missing}  # a text twice is one entry
            entries = [x for pair in fresh_rows.items() for x in pair]
            try:
                self._store(
                    keys=[self._keys.embedding_lru],
                    args=[
                        self._ttl_s,
                        int(time.time() * 1000),
                        self._max_entries,
                        len(entries) // 2,
                        *entries,
                        *dict.fromkeys(hits),
                    ],
                )
            except redis.exceptions.OutOfMemoryError:
                self._guard.dropped("oom", len(missing))
                log.warning("Redis is out of memory: %d embedding cache writes dropped", len(missing))

        return out, write


def _nothing() -> None:
    return None
