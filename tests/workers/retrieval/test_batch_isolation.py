"""One request of a retrieval batch cannot fail another: an index that will not load, a search
that raises, a text the encoder chokes on, or a shard named as an index each fail (or refuse)
their own requests only, with a message that names no file. Narrow fakes around a real
BatchRetriever and small real FAISS indexes: the logic under test is the batch's own."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

import faiss
import numpy as np
import pytest
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import Error, RetrieveRequest, Sources
from ragline.broker.contract.records import IndexInfo
from ragline.workers.retrieval.batch import BatchRetriever
from ragline.workers.retrieval.chunking import Chunk
from ragline.workers.retrieval.index_cache import Serving, UnknownIndex
from ragline.workers.retrieval.loaded_index import LoadedIndex

pytestmark = pytest.mark.unit

DIM = 8
SECRET_PATH = "/srv/ragline/home/indexes/broken/20260101T000000000000Z-abcdef/chunks.jsonl"


def _vector(text: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big")
    v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


class FakeEmbedder:
    model_id, dim = "fake", DIM

    def __init__(self, poison: str = "") -> None:
        self.poison = poison

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if self.poison in texts:
            raise RuntimeError(f"tokenizer blew up reading {SECRET_PATH}")
        return np.stack([_vector(t) for t in texts]) if texts else np.empty((0, DIM), np.float32)


class PassThroughCache:
    def encode_deferred(self, texts: Sequence[str], encode: Any) -> tuple[np.ndarray, Any]:
        return encode(list(texts)), lambda: None


class FailingSearch(LoadedIndex):
    def search_rows(self, *args: Any, **kwargs: Any) -> list[list[tuple[int, float]]]:
        raise RuntimeError(f"Error in faiss::FileIOReader: could not read {SECRET_PATH}")


def _loaded(name: str, cls: type[LoadedIndex] = LoadedIndex) -> LoadedIndex:
    chunks = [Chunk(f"{name}-{i}", f"{name}.md", f"{name} {i}", f"text {i} of {name}") for i in range(6)]
    flat = faiss.IndexFlatIP(DIM)
    flat.add(np.stack([_vector(c.text) for c in chunks]))
    info = IndexInfo(
        name=name, version="v1", path=f"/srv/{name}", chunks=len(chunks), dim=DIM, index_type="flat"
    )
    return cls(info=info, index=flat, chunks=chunks)


class FakeIndexes:
    """The worker's loaded indexes: each a LoadedIndex, or the exception its load raises."""

    def __init__(self, found: dict[str, LoadedIndex | Exception]) -> None:
        self.found = found
        self.asked: list[str] = []

    def _one(self, name: str) -> LoadedIndex:
        self.asked.append(name)
        if name not in self.found:
            raise UnknownIndex(name)
        found = self.found[name]
        if isinstance(found, Exception):
            raise found
        return found

    def get(self, name: str, *, version: str | None = None) -> LoadedIndex:
        return self._one(name)

    def serving(self, name: str, *, version: str | None = None) -> Serving:
        return Serving(self._one(name))


def _retriever(indexes: FakeIndexes, embedder: FakeEmbedder | None = None) -> BatchRetriever:
    settings = Settings().retrieval.model_copy(update={"retrieval_mode": "dense", "reranker_model": ""})
    return BatchRetriever(settings, embedder or FakeEmbedder(), PassThroughCache(), indexes)  # type: ignore[arg-type]


def _request(rid: str, index: str, query: str = "where is the text?") -> RetrieveRequest:
    return RetrieveRequest(
        request_id=rid, query=query, top_k=2, mode="retrieval", index=index, enqueued_at=time.time()
    )


def _events(retriever: BatchRetriever, requests: list[RetrieveRequest]) -> dict[str, list[Any]]:
    by_request: dict[str, list[Any]] = {r.request_id: [] for r in requests}
    for rid, event in retriever.run(requests, picked_at=time.time()).events:
        by_request[rid].append(event)
    return by_request


def _failed_alone(events: list[Any]) -> Error:
    [error] = events
    assert isinstance(error, Error) and error.status >= 500, events
    assert "/" not in error.message and "chunks.jsonl" not in error.message, error.message
    return error


def _answered(events: list[Any]) -> None:
    assert [e.type for e in events] == ["sources", "done"], events
    assert isinstance(events[0], Sources) and events[0].sources


def test_an_index_that_will_not_load_fails_only_its_requests() -> None:
    broken = FileNotFoundError(2, "No such file or directory", SECRET_PATH)
    indexes = FakeIndexes({"good": _loaded("good"), "broken": broken})
    events = _events(
        _retriever(indexes), [_request("a", "good"), _request("b", "broken"), _request("c", "good")]
    )
    _answered(events["a"])
    _answered(events["c"])
    _failed_alone(events["b"])


def test_a_search_that_raises_fails_only_its_requests() -> None:
    indexes = FakeIndexes({"good": _loaded("good"), "bad": _loaded("bad", FailingSearch)})
    events = _events(_retriever(indexes), [_request("a", "bad"), _request("b", "good")])
    _failed_alone(events["a"])
    _answered(events["b"])


def test_a_text_the_encoder_cannot_take_fails_only_its_request() -> None:
    indexes = FakeIndexes({"good": _loaded("good")})
    retriever = _retriever(indexes, FakeEmbedder(poison="poison"))
    events = _events(
        retriever, [_request("a", "good"), _request("b", "good", "poison"), _request("c", "good", "x")]
    )
    _answered(events["a"])
    _answered(events["c"])
    _failed_alone(events["b"])


def test_a_shard_named_as_an_index_is_refused_and_never_loaded() -> None:
    indexes = FakeIndexes({"good": _loaded("good"), "split.shard-0": _loaded("split.shard-0")})
    events = _events(_retriever(indexes), [_request("a", "split.shard-0"), _request("b", "good")])
    [refused] = events["a"]
    assert isinstance(refused, Error) and refused.status == 404 and "'split'" in refused.message
    _answered(events["b"])
    assert "split.shard-0" not in indexes.asked


class UnreachableCache:
    def encode_deferred(self, texts: Sequence[str], encode: Any) -> tuple[np.ndarray, Any]:
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")


@pytest.mark.parametrize("where", ["cache", "index"])
def test_redis_out_of_reach_fails_no_request_the_batch_goes_back(where: str) -> None:
    # Failed one by one, the batch's jobs would end failed for an outage of seconds; raised, the
    # task is requeued (workers/hooked_task.py) and each is served once Redis is back.
    lost = redis.ConnectionError("Connection refused")
    indexes = FakeIndexes({"good": _loaded("good") if where == "cache" else lost})
    settings = Settings().retrieval.model_copy(update={"retrieval_mode": "dense", "reranker_model": ""})
    cache = UnreachableCache() if where == "cache" else PassThroughCache()
    retriever = BatchRetriever(settings, FakeEmbedder(), cache, indexes)  # type: ignore[arg-type]
    with pytest.raises(redis.ConnectionError):
        retriever.run([_request("a", "good"), _request("b", "good", "x")], picked_at=time.time())
