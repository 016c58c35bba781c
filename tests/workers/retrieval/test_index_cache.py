"""A worker's batches never load an index: a new version is loaded beside the serving one, in a
thread, and swapped in when whole. Event-ordered, not timed: each load waits on a gate the test
opens, so "served while it loads" means the load had provably not finished. The registry is the
test Redis; indexes are small real FAISS ones; the batch is a real BatchRetriever on fakes of the
encoder (tests/workers/retrieval/test_batch_isolation.py)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from ragline.broker.contract.messages import (
    Error,
    RetrieveRequest,
    SearchShardTask,
    ShardQuery,
    ShardReply,
    Sources,
)
from ragline.broker.contract.records import IndexInfo
from ragline.broker.redis.keys import Keys
from ragline.broker.state import indexes, shards
from ragline.workers.retrieval.index_cache import IndexCache, IndexLoadFailed, Loading
from ragline.workers.retrieval.loaded_index import LoadedIndex
from ragline.workers.retrieval.shard_search import ShardSearch, serve

from tests.workers.retrieval.test_batch_isolation import _loaded
from tests.workers.retrieval.test_batch_isolation import _retriever as _batch_retriever


class GatedLoads:
    """Loads that each wait for the test to open their gate; a version in ``broken`` fails."""

    def __init__(self) -> None:
        self.gates: dict[str, threading.Event] = {}
        self.started: dict[str, threading.Event] = {}
        self.broken: set[str] = set()

    def gate(self, version: str) -> threading.Event:
        self.started.setdefault(version, threading.Event())
        return self.gates.setdefault(version, threading.Event())

    def __call__(self, info: IndexInfo) -> LoadedIndex:
        self.gate(info.version)
        self.started[info.version].set()
        assert self.gates[info.version].wait(30), f"the test never let {info.version} load"
        if info.version in self.broken:
            raise FileNotFoundError(2, "No such file or directory", f"{info.path}/chunks.jsonl")
        loaded = _loaded(info.name)
        loaded.info = info
        return loaded


@pytest.fixture
def registry(redis_url: str) -> Iterator[tuple[redis.Redis, Keys]]:
    client, keys = redis.Redis.from_url(redis_url), Keys(f"t-cache-{uuid.uuid4().hex[:8]}")
    yield client, keys
    client.delete(keys.indexes, keys.shard_maps)


def _register(registry: tuple[redis.Redis, Keys], version: str, name: str = "docs") -> IndexInfo:
    info = IndexInfo(
        name=name, version=version, path=f"/srv/{name}/{version}", chunks=6, dim=8, index_type="flat"
    )
    indexes.register(*registry, info)
    return info


def _cache(registry: tuple[redis.Redis, Keys], loads: GatedLoads) -> IndexCache:
    return IndexCache(*registry, ef_search=16, recheck_s=0.0, background=True, load_version=loads)


def _request(rid: str, version: str | None, index: str = "docs") -> RetrieveRequest:
    return RetrieveRequest(
        request_id=rid,
        query="where is the text?",
        top_k=2,
        mode="retrieval",
        index=index,
        index_version=version,
        enqueued_at=time.time(),
    )


def _loaded_first(
    registry: tuple[redis.Redis, Keys], loads: GatedLoads, cache: IndexCache, version: str
) -> None:
    _register(registry, version)
    loads.gate(version).set()
    assert cache.get("docs").info.version == version


def test_a_batch_is_served_from_the_old_version_while_the_new_one_loads(
    registry: tuple[redis.Redis, Keys],
) -> None:
    loads = GatedLoads()
    cache = _cache(registry, loads)
    _loaded_first(registry, loads, cache, "v1")
    _register(registry, "v1", name="other")
    cache.get("other")
    _register(registry, "v2")
    retriever = _batch_retriever(cache)  # type: ignore[arg-type]

    # The batch: one request that saw v1, one that saw nothing (a tool), one that saw v2 (the
    # API saw it registered), one on another index. v2's load starts and is held at its gate.
    batch = [
        _request("old", "v1"),
        _request("any", None),
        _request("new", "v2"),
        _request("else", "v1", "other"),
    ]
    result = retriever.run(batch, picked_at=time.time())
    assert loads.started["v2"].wait(5), "v2 was never loaded"
    [deferred] = result.deferred
    assert not deferred.loading.done(), "the load ended before the batch: nothing was shown"

    answered = {rid: e for rid, e in result.events if isinstance(e, Sources)}
    assert answered["old"].index_version == answered["any"].index_version == "v1"
    assert answered["else"].index_version == "v1" and answered["else"].index == "other"
    # Only the request that named v2 waits for it, outside the batch.
    assert "new" not in {rid for rid, _ in result.events}
    assert [r.request_id for r in deferred.requests] == ["new"]
    assert cache.serving("docs").loaded.info.version == "v1"  # type: ignore[union-attr]

    sent_again: list[list[str]] = []
    deferred.loading.when_done(lambda: sent_again.append([r.request_id for r in deferred.requests]))
    assert sent_again == []
    loads.gate("v2").set()
    assert deferred.loading.wait(5)
    assert sent_again == [["new"]]  # called back once the version is in, not before
    # Swapped in: the same requests again are answered from v2 in their batch.
    again = retriever.run([_request("new", "v2"), _request("old", "v1")], picked_at=time.time())
    assert not again.deferred
    versions = {rid: e.index_version for rid, e in again.events if isinstance(e, Sources)}
    assert versions == {"new": "v2", "old": "v2"}  # each names the version searched


def test_a_batch_never_waits_for_a_first_load(registry: tuple[redis.Redis, Keys]) -> None:
    """An index no version of which is loaded yet (registered after the worker started): its
    requests wait for the load; the batch's others are answered."""
    loads = GatedLoads()
    cache = _cache(registry, loads)
    _register(registry, "v1", name="other")
    loads.gate("v1").set()
    cache.get("other")
    _register(registry, "n1", name="docs")
    result = _batch_retriever(cache).run(  # type: ignore[arg-type]
        [_request("late", "n1"), _request("else", "v1", "other")], picked_at=time.time()
    )
    assert [rid for rid, e in result.events if isinstance(e, Sources)] == ["else"]
    assert [r.request_id for d in result.deferred for r in d.requests] == ["late"]
    loads.gate("n1").set()
    assert result.deferred[0].loading.wait(5) and not result.deferred[0].loading.failed


def test_a_version_that_will_not_load_leaves_the_old_one_serving(registry: tuple[redis.Redis, Keys]) -> None:
    loads = GatedLoads()
    cache = _cache(registry, loads)
    _loaded_first(registry, loads, cache, "v1")
    _register(registry, "v2")
    loads.broken.add("v2")
    retriever = _batch_retriever(cache)  # type: ignore[arg-type]
    first = retriever.run([_request("a", "v2")], picked_at=time.time())
    loads.gate("v2").set()
    [deferred] = first.deferred
    assert deferred.loading.wait(5) and deferred.loading.failed
    # Sent again, the request is answered from v1, and says so (the API, which saw v2, does not
    # cache it as v2's answer).
    again = retriever.run(deferred.requests, picked_at=time.time())
    assert not again.deferred
    [(_, sources), _done] = again.events
    assert isinstance(sources, Sources) and sources.index_version == "v1" and sources.sources
    assert cache.serving("docs").loaded.info.version == "v1"  # type: ignore[union-attr]


def test_an_index_whose_only_version_will_not_load_fails_alone(registry: tuple[redis.Redis, Keys]) -> None:
    loads = GatedLoads()
    cache = _cache(registry, loads)
    _register(registry, "v1", name="other")
    loads.gate("v1").set()
    cache.get("other")
    _register(registry, "b1", name="docs")
    loads.broken.add("b1")
    retriever = _batch_retriever(cache)  # type: ignore[arg-type]
    first = retriever.run([_request("a", "b1")], picked_at=time.time())
    loads.gate("b1").set()
    assert first.deferred[0].loading.wait(5)
    again = retriever.run([_request("a", "b1"), _request("b", "v1", "other")], picked_at=time.time())
    by_request: dict[str, list[Any]] = {}
    for rid, event in again.events:
        by_request.setdefault(rid, []).append(event)
    [error] = by_request["a"]
    assert isinstance(error, Error) and error.status == 503 and "/" not in error.message
    assert isinstance(by_request["b"][0], Sources)
    with pytest.raises(IndexLoadFailed) as failed:
        cache.get("docs")
    assert "/srv" not in str(failed.value)


def test_tools_still_load_in_the_callers_thread(registry: tuple[redis.Redis, Keys]) -> None:
    calls: list[str] = []

    def load(info: IndexInfo) -> LoadedIndex:
        calls.append(threading.current_thread().name)
        loaded = _loaded(info.name)
        loaded.info = info
        return loaded

    cache = IndexCache(*registry, ef_search=16, recheck_s=0.0, load_version=load)
    _register(registry, "v1")
    assert cache.serving("docs").loaded.info.version == "v1"  # type: ignore[union-attr]
    _register(registry, "v2")
    assert cache.get("docs").info.version == "v2"
    assert calls == [threading.current_thread().name] * 2


def _sharded(registry: tuple[redis.Redis, Keys], versions: dict[str, str]) -> str:
    """A sharded index ``split`` whose shards are at ``versions`` (by key); its logical version."""
    shard_map = shards.ShardMap(index="split", shard_by=None, keys=tuple(versions), count=len(versions))
    parts = [_register(registry, v, name=shards.shard_index("split", k)) for k, v in versions.items()]
    logical = shards.logical_info(shard_map, parts, path="/srv/split")
    shards.register(*registry, shard_map, logical)
    return logical.version


def test_a_sharded_search_never_loads_a_shard_inside_the_batch(registry: tuple[redis.Redis, Keys]) -> None:
    """A coordinator holding the shards: a registered shard version not loaded yet makes the
    group wait for it outside the batch, as on a plain index; one that fails to load leaves the
    version before it answering, and that answer names no version (it is not the registered
    logical version's, so the API does not cache it as that)."""
    loads = GatedLoads()
    cache = _cache(registry, loads)
    first = _sharded(registry, {"0": "a1", "1": "b1"})
    loads.gate("a1").set()
    cache.get("split.shard-0")  # shard 1 is not loaded yet
    retriever = _batch_retriever(cache)  # type: ignore[arg-type]
    retriever._shards = ShardSearch(
        registry[0],
        registry[1],
        retriever._settings,
        cache,
        lambda task: None,
        held=None,
        socket_timeout_s=5.0,
        heartbeat_ttl_s=2.0,
        recheck_s=0.0,
    )

    def ask(version: str | None) -> Sources | Loading:
        result = retriever.run([_request("q", version, "split")], picked_at=time.time())
        if result.deferred:
            [deferred] = result.deferred
            assert not result.events
            return deferred.loading
        [sources] = [e for _, e in result.events if isinstance(e, Sources)]
        return sources

    held = ask(first)
    assert isinstance(held, Loading) and held.info.name == "split.shard-1"
    assert loads.started["b1"].wait(5) and not held.done()
    loads.gate("b1").set()
    assert held.wait(5)
    whole = ask(first)
    assert isinstance(whole, Sources) and not whole.partial and whole.index_version == first

    # Shard 1 re-ingested: the group naming the new logical version waits for its load.
    second = _sharded(registry, {"0": "a1", "1": "b2"})
    waiting = ask(second)
    assert isinstance(waiting, Loading) and waiting.version == "b2"
    loads.gate("b2").set()
    assert waiting.wait(5)
    done = ask(second)
    assert isinstance(done, Sources) and done.index_version == second

    # Re-ingested again, and that version will not load: the one before answers, naming no version.
    third = _sharded(registry, {"0": "a1", "1": "b3"})
    loads.broken.add("b3")
    failing = ask(third)
    loads.gate("b3").set()
    assert isinstance(failing, Loading) and failing.wait(5) and failing.failed
    stale = ask(third)
    assert isinstance(stale, Sources) and not stale.partial and stale.index_version is None


def test_a_shard_worker_answers_its_task_once_the_registered_version_is_in(
    registry: tuple[redis.Redis, Keys],
) -> None:
    loads = GatedLoads()
    cache = _cache(registry, loads)
    _register(registry, "s1", name="split.shard-0")
    loads.gate("s1").set()
    cache.get("split.shard-0")
    _register(registry, "s2", name="split.shard-0")
    task = SearchShardTask(
        search_id="s",
        reply_to="r",
        shard="split.shard-0",
        queries=[ShardQuery(query="q", mode="dense", vector=[0.5] * 8)],
        depth=2,
        deadline=time.time() + 30,
    )
    settings = _batch_retriever(cache)._settings  # type: ignore[arg-type]
    waiting = serve(task, cache, settings)
    assert isinstance(waiting, Loading) and waiting.version == "s2" and not waiting.done()
    loads.gate("s2").set()
    assert waiting.wait(5)
    reply = serve(task, cache, settings)
    assert isinstance(reply, ShardReply) and reply.version == "s2" and len(reply.hits[0]) == 2
