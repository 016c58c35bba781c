"""The level-1 result cache on a real Redis: versions, single flight, LRU entry and byte budgets."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from ragline.broker.contract.records import IndexInfo
from ragline.broker.redis.keys import Keys
from ragline.broker.state import indexes
from ragline.broker.state.result_cache import SHED_PER_DROPPED_WRITE, Outcome, ResultCache

from tests.helpers import fill_to, redis_server


def _setup(redis_url: str, max_entries: int = 100) -> tuple[Keys, redis.Redis]:
    keys = Keys(f"ragline-test-{uuid.uuid4().hex[:8]}")
    client = redis.Redis.from_url(redis_url)
    indexes.register(client, keys, IndexInfo(name="docs", version="v1", path="/x", chunks=1, dim=4))
    return keys, client


def _cache(
    redis_url: str, keys: Keys, max_entries: int = 100, max_bytes: int = 1 << 30
) -> tuple[ResultCache, aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    cache = ResultCache(
        client, keys, ttl_s=60, max_entries=max_entries, max_bytes=max_bytes, single_flight_ttl_s=5
    )
    return cache, client


def test_unknown_index_lead_follow_store_hit_and_new_version(redis_url: str) -> None:
    keys, sync = _setup(redis_url)

    async def scenario() -> None:
        cache, client = _cache(redis_url, keys)
        assert (await cache.lookup("nope", "d1", request_id="r1")).outcome is Outcome.UNKNOWN_INDEX
        lead = await cache.lookup("docs", "d1", request_id="r1")
        assert (lead.outcome, lead.version) == (Outcome.LEAD, "v1")
        follow = await cache.lookup("docs", "d1", request_id="r2")
        assert (follow.outcome, follow.leader) == (Outcome.FOLLOW, "r1")
        assert (await cache.lookup("docs", "d1")).outcome is Outcome.MISS  # no single flight asked

        key = lead.key(keys, "docs", "d1")
        await cache.store(key, b'{"answer":"x"}', leader="r1")
        hit = await cache.lookup("docs", "d1", request_id="r3")
        assert (hit.outcome, hit.body) == (Outcome.HIT, b'{"answer":"x"}')

        # A re-ingest registers v2: the old answer is not served.
        indexes.register(sync, keys, IndexInfo(name="docs", version="v2", path="/y", chunks=1, dim=4))
        assert (await cache.lookup("docs", "d1", request_id="r4")).outcome is Outcome.LEAD
        await client.aclose()

    asyncio.run(scenario())


def test_failed_leader_releases_its_claim(redis_url: str) -> None:
    keys, _ = _setup(redis_url)

    async def scenario() -> None:
        cache, client = _cache(redis_url, keys)
        lead = await cache.lookup("docs", "d", request_id="r1")
        await cache.release(lead.key(keys, "docs", "d"), "someone-else")  # not the holder: no effect
        assert (await cache.lookup("docs", "d", request_id="r2")).outcome is Outcome.FOLLOW
        await cache.release(lead.key(keys, "docs", "d"), "r1")
        assert (await cache.lookup("docs", "d", request_id="r3")).outcome is Outcome.LEAD
        await client.aclose()

    asyncio.run(scenario())


def test_entry_budget_evicts_least_recently_used(redis_url: str) -> None:
    keys, sync = _setup(redis_url)

    async def scenario() -> list[Outcome]:
        cache, client = _cache(redis_url, keys, max_entries=3)
        for d in ("a", "b", "c"):
            found = await cache.lookup("docs", d)
            await cache.store(found.key(keys, "docs", d), json.dumps({"d": d}).encode())
            await asyncio.sleep(0.002)
        await cache.lookup("docs", "a")  # touch a: b is now the least recently used
        await asyncio.sleep(0.002)
        found = await cache.lookup("docs", "d")
        await cache.store(found.key(keys, "docs", "d"), b"{}")
        outcomes = [(await cache.lookup("docs", d)).outcome for d in ("a", "b", "c", "d")]
        await client.aclose()
        return outcomes

    assert asyncio.run(scenario()) == [Outcome.HIT, Outcome.MISS, Outcome.HIT, Outcome.HIT]
    assert sync.zcard(f"{keys.result_cache}:lru") == 3


def test_byte_budget_holds_under_many_large_answers(redis_url: str) -> None:
    keys, sync = _setup(redis_url)
    budget = 1_000_000
    body = json.dumps({"answer": "x" * 60_000}).encode()  # a top_k=50 answer's size

    async def scenario() -> list[Outcome]:
        cache, client = _cache(redis_url, keys, max_entries=10_000, max_bytes=budget)
        for i in range(200):  # 12 MB written into a 1 MB budget
            found = await cache.lookup("docs", f"q{i}")
            assert await cache.store(found.key(keys, "docs", f"q{i}"), body)
        outcomes = [(await cache.lookup("docs", f"q{i}")).outcome for i in (0, 100, 199)]
        await client.aclose()
        return outcomes

    assert asyncio.run(scenario()) == [Outcome.MISS, Outcome.MISS, Outcome.HIT]  # the newest stay
    entries = sync.keys(f"{keys.result_cache}:docs:*")
    held = sum(sync.strlen(k) + len(k) for k in entries)
    assert 0 < held <= budget and len(entries) == budget // len(body)
    assert int(sync.get(f"{keys.result_cache}:bytes")) == held  # the running total is exact
    assert sync.zcard(f"{keys.result_cache}:lru") == sync.hlen(f"{keys.result_cache}:sizes") == len(entries)


def test_an_answer_over_the_whole_byte_budget_is_not_stored_and_frees_its_claim(redis_url: str) -> None:
    keys, _ = _setup(redis_url)

    async def scenario() -> None:
        cache, client = _cache(redis_url, keys, max_bytes=1000)
        lead = await cache.lookup("docs", "big", request_id="r1")
        assert not await cache.store(lead.key(keys, "docs", "big"), b"x" * 2000, leader="r1")
        assert (await cache.lookup("docs", "big", request_id="r2")).outcome is Outcome.LEAD
        await client.aclose()

    asyncio.run(scenario())


@pytest.mark.redis  # a redis-server of its own
def test_near_the_memory_limit_the_cache_shrinks_oldest_first(tmp_path: Path) -> None:
    """Past the memory fraction a write is dropped and the least recently used entries go, so
    the cache gives its memory back while the pressure lasts; the byte total stays exact."""
    keys = Keys(f"ragline-test-{uuid.uuid4().hex[:8]}")
    body = json.dumps({"answer": "x" * 60_000}).encode()
    with redis_server(tmp_path, maxmemory="16mb") as sync:
        indexes.register(sync, keys, IndexInfo(name="docs", version="v1", path="/x", chunks=1, dim=4))
        url = f"redis://127.0.0.1:{sync.connection_pool.connection_kwargs['port']}/0"

        async def scenario() -> None:
            client = aioredis.Redis.from_url(url)
            cache = ResultCache(
                client,
                keys,
                ttl_s=60,
                max_entries=100,
                max_bytes=1 << 30,
                single_flight_ttl_s=5,
                max_memory_fraction=0.7,
            )
            for i in range(5):
                found = await cache.lookup("docs", f"q{i}")
                assert await cache.store(found.key(keys, "docs", f"q{i}"), body)
            fill_to(sync, 0.75)
            await asyncio.sleep(1.1)  # the guard's next reading
            found = await cache.lookup("docs", "new")
            assert not await cache.store(found.key(keys, "docs", "new"), body)
            assert [(await cache.lookup("docs", f"q{i}")).outcome for i in range(5)] == (
                [Outcome.MISS] * SHED_PER_DROPPED_WRITE + [Outcome.HIT] * (5 - SHED_PER_DROPPED_WRITE)
            )
            await client.aclose()

        asyncio.run(scenario())
        left = sync.keys(f"{keys.result_cache}:docs:*")
        assert int(sync.get(f"{keys.result_cache}:bytes")) == sum(sync.strlen(k) + len(k) for k in left)
