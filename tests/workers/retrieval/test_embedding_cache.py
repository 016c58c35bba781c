"""The level-2 embedding cache: one encode call for the misses only."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import redis
from prometheus_client import REGISTRY
from ragline.broker.redis.keys import Keys
from ragline.workers.retrieval.embedding_cache import EmbeddingCache

from tests.helpers import fill_to, redis_server


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


def _encode(texts: list[str]) -> np.ndarray:
    return np.array([[len(t), 1.0, 2.0] for t in texts], dtype=np.float32)


def _cached(client: redis.Redis, keys: Keys) -> int:
    return sum(1 for k in client.scan_iter(f"{keys.prefix}:emb:*") if not k.endswith(b":lru"))


def test_the_cache_keeps_within_its_entry_budget(redis_url: str) -> None:
    """Past the budget the least recently used entries go; a hit counts as a use."""
    client, keys = redis.Redis.from_url(redis_url), Keys(f"t-{uuid.uuid4().hex[:6]}")
    cache = EmbeddingCache(client, keys, model_id="m", dim=3, ttl_s=60, max_entries=5)
    for text in ["text 0", "text 1", "text 2", "text 3", "text 0", "text 4", "text 5"]:  # 0 used again
        cache.encode([text], _encode)
        time.sleep(0.002)  # recency is kept in milliseconds
    assert _cached(client, keys) == 5
    calls: list[list[str]] = []
    cache.encode(["text 0", "text 5", "text 1"], lambda t: calls.append(list(t)) or _encode(t))
    assert calls == [["text 1"]]  # 0 and 5 were kept; 1, least recently used, was not
    assert client.ttl(keys.embedding_lru) > 0


@pytest.mark.redis  # a redis-server of its own
def test_near_the_memory_limit_writes_are_dropped_first(tmp_path: Path) -> None:
    """A Redis at 3/4 of its maxmemory: the cache answers, writes nothing and counts what it
    dropped, so the memory left is the queues', the door's and the jobs'."""
    with redis_server(tmp_path, maxmemory="8mb") as client:
        fill_to(client, 0.75)
        keys = Keys("near-limit")
        cache = EmbeddingCache(client, keys, model_id="m", dim=3, ttl_s=60, max_memory_fraction=0.7)
        before = _dropped("memory")
        vectors = cache.encode(["a", "bb"], _encode)
        assert vectors.tolist() == [[1.0, 1.0, 2.0], [2.0, 1.0, 2.0]]
        assert _cached(client, keys) == 0 and _dropped("memory") == before + 2


@pytest.mark.redis  # a redis-server of its own
def test_an_out_of_memory_redis_never_fails_the_encode(tmp_path: Path) -> None:
    with redis_server(tmp_path, maxmemory="8mb") as client:
        fill_to(client, 1.0)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("one-more", b"x" * 20_000)
        keys = Keys("full")
        # The guard off (fraction 1): Redis itself refuses the write.
        cache = EmbeddingCache(client, keys, model_id="m", dim=3, ttl_s=60, max_memory_fraction=1.0)
        before = _dropped("oom")
        assert cache.encode(["a", "bb", "ccc"], _encode).shape == (3, 3)
        assert _dropped("oom") == before + 3 and _cached(client, keys) == 0


def _dropped(reason: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "ragline_cache_writes_dropped_total", {"level": "embedding", "reason": reason}
        )
        or 0.0
    )
