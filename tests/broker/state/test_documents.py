"""Document lists, the registry's compare-and-swap, scopes in the API key check and ingest job records,
on a real Redis."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis
from ragline.broker.contract.messages import Error, IngestProgress, IngestResult
from ragline.broker.contract.records import IndexInfo, IngestRequest, JobRecord, JobView
from ragline.broker.limits.ratelimit import AuthRateLimiter, Limits
from ragline.broker.redis.keys import Keys
from ragline.broker.state import apikeys, documents, indexes, jobs
from ragline.broker.state.documents import DocumentEntry


@pytest.fixture
def keys(redis_url: str) -> Iterator[Keys]:
    k = Keys(f"ragline-test-docs-{uuid.uuid4().hex[:8]}")
    yield k
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{k.prefix}:*"):
        client.delete(key)


def test_a_version_lists_its_documents_in_pages_by_id(redis_url: str, keys: Keys) -> None:
    client = redis.Redis.from_url(redis_url)
    entries = [DocumentEntry(f"doc-{i:02d}", f"Title {i}", f"dir/doc-{i:02d}.md", i + 1) for i in range(7)]
    assert documents.write(client, keys, "ix", "v1", reversed(entries)) == 7
    assert documents.listed(client, keys, "ix", "v1") and not documents.listed(client, keys, "ix", "v2")

    async def pages() -> list[tuple[list[DocumentEntry], str | None]]:
        aclient = aioredis.Redis.from_url(redis_url)
        found, after = [], None
        while True:
            page = await documents.apage(aclient, keys, "ix", "v1", after=after, limit=3)
            assert page is not None
            found.append(page)
            after = page[1]
            if after is None:
                break
        assert await documents.apage(aclient, keys, "ix", "v2", after=None, limit=3) is None
        assert await documents.acount(aclient, keys, "ix", "v1") == 7
        assert await documents.aget(aclient, keys, "ix", "v1", "doc-03") == entries[3]
        assert await documents.aget(aclient, keys, "ix", "v1", "nope") is None
        await aclient.aclose()
        return found

    found = asyncio.run(pages())
    assert [len(p[0]) for p in found] == [3, 3, 1]
    assert [e for p in found for e in p[0]] == entries
    documents.retire(client, keys, "ix", "v1", ttl_s=30)
    assert 0 < client.ttl(keys.documents("ix", "v1")) <= 30


def test_a_sharded_index_lists_its_shards_documents_as_one(redis_url: str, keys: Keys) -> None:
    client = redis.Redis.from_url(redis_url)
    shard_a = [DocumentEntry(f"doc-{i:02d}", f"T{i}", f"doc-{i:02d}", 2) for i in (0, 2, 4, 6)]
    shard_b = [DocumentEntry(f"doc-{i:02d}", f"T{i}", f"doc-{i:02d}", 3) for i in (1, 3, 5)]
    # doc-04 in both: re-ingested under another shard key, its old copy not removed.
    shard_b.append(DocumentEntry("doc-04", "T4", "doc-04", 5))
    documents.write(client, keys, "ix.shard-a", "va", shard_a)
    documents.write(client, keys, "ix.shard-b", "vb", shard_b)
    versions = [("ix.shard-a", "va"), ("ix.shard-b", "vb")]

    async def run() -> tuple[list[tuple[list[DocumentEntry], str | None]], int, list[str], bool]:
        aclient = aioredis.Redis.from_url(redis_url)
        found, after = [], None
        while True:
            page = await documents.apage_merged(aclient, keys, versions, after=after, limit=3)
            assert page is not None
            found.append(page)
            after = page[1]
            if after is None:
                break
        total = await documents.acount_merged(aclient, keys, versions)
        holders = await documents.aholders(aclient, keys, versions, "doc-04")
        unlisted = await documents.apage_merged(
            aclient, keys, [*versions, ("ix.shard-c", "vc")], after=None, limit=3
        )
        await aclient.aclose()
        return found, total, holders, unlisted is None

    found, total, holders, unlisted = asyncio.run(run())
    listed = [e for page, _ in found for e in page]
    assert [e.id for e in listed] == [f"doc-{i:02d}" for i in range(7)]
    assert [len(page) for page, _ in found] == [3, 3, 1]
    assert next(e for e in listed if e.id == "doc-04").chunks == 7  # both copies' chunks
    assert total == 8 and holders == ["ix.shard-a", "ix.shard-b"]
    assert unlisted, "a shard without a list makes the whole list unavailable, not short"


def test_a_version_registers_only_over_the_one_it_was_built_on(redis_url: str, keys: Keys) -> None:
    client = redis.Redis.from_url(redis_url)
    v1 = IndexInfo(name="ix", version="v1", path="/p/v1", chunks=3, dim=384)
    v2 = IndexInfo(name="ix", version="v2", path="/p/v2", chunks=4, dim=384)
    assert indexes.replace(client, keys, v1, expected=None)
    assert not indexes.replace(client, keys, v2, expected=None), "another version is registered"
    assert indexes.replace(client, keys, v2, expected="v1")
    assert not indexes.replace(client, keys, v1, expected="v1"), "v1 was replaced meanwhile"
    assert indexes.lookup(client, keys, "ix") == v2

    async def unregister() -> IndexInfo | None:
        aclient = aioredis.Redis.from_url(redis_url)
        try:
            return await indexes.aunregister(aclient, keys, "ix")
        finally:
            await aclient.aclose()

    assert asyncio.run(unregister()) == v2
    assert indexes.lookup(client, keys, "ix") is None
    assert not indexes.replace(client, keys, v1, expected="v2"), "deleted meanwhile: not resurrected"


def test_scopes_are_checked_and_legacy_keys_read(redis_url: str, keys: Keys) -> None:
    assert apikeys.may_write(["admin"], "any") and apikeys.may_write(["write:a"], "a")
    assert not apikeys.may_write(["write:a"], "b") and not apikeys.may_write(["read"], "a")
    for bad in ("write", "write:..", "owner", "write:a/b"):
        with pytest.raises(ValueError):
            apikeys.check_scope(bad)
    client = redis.Redis.from_url(redis_url)
    writer, _ = apikeys.create(client, keys, "w", scopes=["write:docs", "read"])
    reader, _ = apikeys.create(client, keys, "r")
    legacy, record = apikeys.create(client, keys, "old")
    raw = json.loads(client.hget(keys.api_keys, apikeys.digest(legacy)))
    del raw["scopes"]  # as keys were recorded before scopes
    client.hset(keys.api_keys, apikeys.digest(legacy), json.dumps(raw))
    assert apikeys.list_keys(client, keys)[-1].effective_scopes == apikeys.LEGACY_SCOPES
    limits = Limits(key_rate=100, key_burst=100, global_rate=0, global_burst=0)

    async def verdicts(auth: bool) -> list[tuple[str, ...]]:
        aclient = aioredis.Redis.from_url(redis_url)
        limiter = AuthRateLimiter(aclient, keys, limits, auth=auth, rate_limit=True)
        try:
            return [(await limiter.check(k)).scopes for k in (writer, reader, legacy)]
        finally:
            await aclient.aclose()

    assert asyncio.run(verdicts(True)) == [("read", "write:docs"), ("read",), ("read",)]
    assert asyncio.run(verdicts(False)) == [("admin",)] * 3, "no keys (a local demo): anyone writes"
    assert apikeys.set_scopes(client, keys, record.id, ["admin"])
    assert asyncio.run(verdicts(True))[2] == ("admin",)
    assert not apikeys.set_scopes(client, keys, "key_nope", ["admin"])


def test_an_ingest_job_shows_its_progress_and_ends_with_its_version(redis_url: str) -> None:
    keys = Keys(f"ragline-test-ij-{uuid.uuid4().hex[:6]}")
    client = redis.Redis.from_url(redis_url)
    job_id = uuid.uuid4().hex
    record = jobs.new_ingest_record(
        job_id=job_id,
        owner="k1",
        request=IngestRequest(index="ix", operation="add", documents=["a.md"]),
        webhook_url=None,
        now=time.time(),
    )
    client.hset(keys.job(job_id), mapping=record.encode())
    tracker = jobs.JobTracker(client, keys, job_id, job_ttl_s=60)
    assert tracker.start("ingesting")
    assert tracker.progress(IngestProgress(phase="embedding", chunks_embedded=32, chunks_total=80))
    view = JobView.of(JobRecord.decode(client.hgetall(keys.job(job_id)))).model_dump(mode="json")
    assert (view["kind"], view["status"]) == ("ingest", "ingesting")
    assert view["progress"] == {"phase": "embedding", "chunks_embedded": 32, "chunks_total": 80}
    result = IngestResult(index="ix", version="v2", documents=3, chunks=80, added=1, embedded=80)
    assert tracker.finish_ingest(keys.events(job_id), result, stream_ttl_s=60, maxlen=100) == "first"
    assert (
        tracker.finish_ingest(
            keys.events(job_id), Error(status=500, message="x"), stream_ttl_s=60, maxlen=100
        )
        == "late"
    )
    assert not tracker.progress(IngestProgress(phase="registering")), "a finished job takes no more progress"
    view = JobView.of(JobRecord.decode(client.hgetall(keys.job(job_id)))).model_dump(mode="json")
    assert view["status"] == "done" and view["result"]["version"] == "v2"

    parsed = JobView.model_validate(view)
    assert isinstance(parsed.result, IngestResult) and parsed.request.operation == "add"  # type: ignore[union-attr]
    for key in client.scan_iter(f"{keys.prefix}:*"):
        client.delete(key)
