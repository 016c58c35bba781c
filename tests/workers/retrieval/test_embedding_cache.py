"""The level-2 embedding cache: one encode call for the misses only."""

from __future__ import annotations

import uuid

import numpy as np
import redis

from broker.keys import Keys
from workers.retrieval.embedding_cache import EmbeddingCache


def test_only_misses_are_encoded(redis_url: str) -> None:
    calls: list[list[str]] = []

    def encode(texts: list[str]) -> np.ndarray:
        calls.append(list(texts))
        return np.array([[len(t), 1.0, 2.0] for t in texts], dtype=np.float32)

    cache = EmbeddingCache(
        redis.Redis.from_url(redis_url), Keys(f"t-{uuid.uuid4().hex[:6]}"), model_id="m", dim=3, ttl_s=60
    )
    first = cache.encode(["aa", "bbb"], encode)
    second = cache.encode(["bbb", "c", "aa"], encode)
    assert calls == [["aa", "bbb"], ["c"]]
    assert np.array_equal(second[0], first[1]) and np.array_equal(second[2], first[0])
    assert second[1].tolist() == [1.0, 1.0, 2.0]
