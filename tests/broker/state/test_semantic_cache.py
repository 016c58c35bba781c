"""The semantic cache's store on a real Redis: a worker's pending miss made an entry by the API,
read back after an id, and the budgets per scope and in all (whole scopes out, least recently
written first)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis
from ragline.broker.redis.keys import Keys
from ragline.broker.state.semantic_cache import Pending, SemanticCommits, SemanticStore, scope_of

VECTOR = bytes(range(16))  # four float32s' worth: the store keeps bytes as they come


@pytest.fixture
def keys(redis_url: str) -> Iterator[Keys]:
    keys = Keys(f"ragline-test-{uuid.uuid4().hex[:8]}")
    yield keys
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{keys.prefix}:*"):
        client.delete(key)


def _store(redis_url: str, keys: Keys) -> SemanticStore:
    return SemanticStore(redis.Redis.from_url(redis_url), keys, pending_ttl_s=60)


def _commit(redis_url: str, keys: Keys, items: list[tuple[str, str, str]], **budget: int) -> list[bool]:
    """Commit each (request id, scope, answer key) in turn, as the API does."""

    async def run() -> list[bool]:
        client = aioredis.Redis.from_url(redis_url)
        commits = SemanticCommits(
            client,
            keys,
            ttl_s=60,
            scope_max_entries=budget.get("scope_max_entries", 100),
            max_entries=budget.get("max_entries", 1000),
        )
        try:
            return [await commits.commit(rid, scope, key) for rid, scope, key in items]
        finally:
            await client.aclose()

    return asyncio.run(run())


def test_a_proposed_miss_becomes_an_entry_once_committed(redis_url: str, keys: Keys) -> None:
    store = _store(redis_url, keys)
    assert store.read({"s1": ""})["s1"].exists is False
    store.propose([Pending("r1", "s1", "How do I deep-copy a list?", VECTOR)])
    assert store.read({"s1": ""})["s1"].entries == []  # pending only: no answer yet

    assert _commit(redis_url, keys, [("r1", "s1", "qc:docs:v1:abc")]) == [True]
    read = store.read({"s1": ""})["s1"]
    assert read.exists
    [entry] = read.entries
    assert (entry.question, entry.vector, entry.answer_key) == (
        "How do I deep-copy a list?",
        VECTOR,
        "qc:docs:v1:abc",
    )
    assert store.read({"s1": entry.id})["s1"].entries == []  # after its id: nothing new
    # Committed once: the pending entry is gone.
    assert _commit(redis_url, keys, [("r1", "s1", "qc:docs:v1:abc")]) == [False]
    assert not redis.Redis.from_url(redis_url).exists(keys.semantic_pending("r1"))


def test_nothing_is_committed_without_a_pending_entry_of_that_scope(redis_url: str, keys: Keys) -> None:
    store = _store(redis_url, keys)
    store.propose([Pending("r1", "s1", "q", VECTOR)])
    # The API's scope differs from the worker's (they never should): nothing is remembered.
    assert _commit(redis_url, keys, [("r1", "s2", "k"), ("r-unknown", "s1", "k")]) == [False, False]
    read = store.read({"s1": "", "s2": ""})
    assert (read["s1"].exists, read["s2"].exists) == (False, False)


def test_each_scope_keeps_its_newest_entries(redis_url: str, keys: Keys) -> None:
    store = _store(redis_url, keys)
    for i in range(5):
        store.propose([Pending(f"r{i}", "s1", f"q{i}", VECTOR)])
    _commit(redis_url, keys, [(f"r{i}", "s1", f"k{i}") for i in range(5)], scope_max_entries=3)
    assert [e.question for e in store.read({"s1": ""})["s1"].entries] == ["q2", "q3", "q4"]


def test_past_the_total_whole_scopes_go_least_recently_written_first(redis_url: str, keys: Keys) -> None:
    store = _store(redis_url, keys)
    order = [("a", 2), ("b", 2), ("a", 1), ("c", 2)]  # "b" is the least recently written when "c" comes
    items = []
    for n, (scope, count) in enumerate(order):
        for i in range(count):
            rid = f"r{n}-{i}"
            store.propose([Pending(rid, scope, f"{scope}{n}{i}", VECTOR)])
            items.append((rid, scope, f"k-{rid}"))
    _commit(redis_url, keys, items, max_entries=5)
    read = store.read({"a": "", "b": "", "c": ""})
    assert (read["a"].exists, read["b"].exists, read["c"].exists) == (True, False, True)
    assert len(read["a"].entries) + len(read["c"].entries) == 5
    client = redis.Redis.from_url(redis_url)
    assert int(client.get(keys.semantic_scope("") + "total") or 0) == 5


def test_scopes_differ_in_every_part() -> None:
    base = scope_of("key_1", "docs", "v1", ("rag", 5, ""))
    assert scope_of("key_1", "docs", "v1", ("rag", 5, "")) == base
    for other in (
        scope_of("key_2", "docs", "v1", ("rag", 5, "")),
        scope_of("", "docs", "v1", ("rag", 5, "")),
        scope_of("key_1", "other", "v1", ("rag", 5, "")),
        scope_of("key_1", "docs", "v2", ("rag", 5, "")),
        scope_of("key_1", "docs", "v1", ("retrieval", 5, "")),
        scope_of("key_1", "docs", "v1", ("rag", 3, "")),
        scope_of("key_1", "docs", "v1", ("rag", 5, '{"path": "faq"}')),
    ):
        assert other != base
