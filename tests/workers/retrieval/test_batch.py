"""A retrieval batch on real MiniLM + FAISS: one encode, per-request top_k, early exit both ways."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis
import redis.asyncio as aioredis
from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import CachedAnswer, Degradation, Done, Error, RetrieveRequest, Sources
from ragline.broker.redis.keys import Keys
from ragline.broker.state.semantic_cache import SemanticCommits, SemanticStore

from tests.helpers import batch_retriever

pytestmark = pytest.mark.integration


BUSY = Degradation(degraded_reason="generation_busy", notice="busy")


def _request(rid: str, query: str, **extra: object) -> RetrieveRequest:
    fields: dict = {"top_k": 3, "mode": "rag", "index": "test", **extra}
    return RetrieveRequest(request_id=rid, query=query, enqueued_at=time.time(), **fields)


def test_batch_answers_each_request(settings: Settings, embedder, test_index: str) -> None:
    retriever = batch_retriever(settings, embedder)
    result = retriever.run(
        [
            _request("a", "When does Café Lumière open?"),
            _request("b", "How often should I oil my bicycle chain?", mode="retrieval", top_k=1),
            _request("c", "When does Café Lumière open?", index="missing"),
            _request("d", "Is the library open on Mondays?", mode="retrieval", degraded=BUSY),
        ],
        picked_at=time.time(),
    )
    by_request: dict = {}
    for rid, event in result.events:
        by_request.setdefault(rid, []).append(event)
    assert [e.type for e in by_request["a"]] == ["sources"]
    assert by_request["a"][0].sources[0].source.endswith("cafe.md")
    assert [e.type for e in by_request["b"]] == ["sources", "done"]
    assert len(by_request["b"][0].sources) == 1
    assert by_request["c"] == [Error(status=404, message="unknown index 'missing'")]
    degraded = by_request["d"][1]
    assert (degraded.degraded, degraded.degraded_reason, degraded.notice) == (True, "generation_busy", "busy")
    assert by_request["b"][1].degraded is False
    [task] = result.to_generate
    assert task.request_id == "a" and task.sources == by_request["a"][0].sources
    assert task.timings.retrieval_ms > 0


def test_early_exit_when_allowed_and_above_threshold(settings: Settings, embedder, test_index: str) -> None:
    q = "When does Café Lumière open in the morning?"
    off = batch_retriever(settings, embedder)  # the default: always generate
    assert len(off.run([_request("x", q)], picked_at=time.time()).to_generate) == 1

    on = batch_retriever(settings, embedder, early_exit_score=0.3)
    result = on.run([_request("y", q), _request("z", q, allow_early_exit=False)], picked_at=time.time())
    done = [event for _rid, event in result.events if isinstance(event, Done)]
    assert len(done) == 1 and done[0].early_exit is True and "7:15" in (done[0].answer or "")
    # The answer is the best source itself, cited as [1].
    assert [(c.marker, c.title) for c in done[0].citations] == [(1, "Café Lumière")]
    assert [t.request_id for t in result.to_generate] == ["z"]

    strict = batch_retriever(settings, embedder, early_exit_score=0.99)
    assert len(strict.run([_request("w", q)], picked_at=time.time()).to_generate) == 1


def _semantic_cache(settings: Settings, embedder, keys: Keys, threshold: float):
    from ragline.workers.retrieval.index_builders import HnswParams
    from ragline.workers.retrieval.semantic_cache import SemanticCache

    store = SemanticStore(redis.Redis.from_url(settings.redis.redis_url), keys, pending_ttl_s=60)
    return SemanticCache(
        store,
        dim=embedder.dim,
        threshold=threshold,
        hnsw=HnswParams(16, 40, 16),
        scope_max_entries=100,
        loaded_scopes=4,
    )


def test_a_semantic_hit_is_answered_before_the_search_with_the_earlier_answer(
    settings: Settings, embedder, test_index: str
) -> None:
    keys = Keys(f"ragline-test-{uuid.uuid4().hex[:8]}")
    client = redis.Redis.from_url(settings.redis.redis_url)
    retriever = batch_retriever(settings, embedder, semantic=_semantic_cache(settings, embedder, keys, 0.9))
    asked = "When does Café Lumière open?"
    try:
        # A miss: searched as ever, and proposed for the API to remember.
        first = retriever.run([_request("a", asked, semantic_scope="key_1")], picked_at=time.time())
        [task] = first.to_generate
        assert client.exists(keys.semantic_pending("a"))
        # The API stored its answer and remembered it (what api/pipeline/steps.py does).
        answer_key = f"{keys.prefix}:qc:test:v:a"
        stored = CachedAnswer(answer="At 7:15 [1].", cached=True, sources=task.sources)
        client.set(answer_key, stored.encode(), ex=60)

        async def commit() -> bool:
            aclient = aioredis.Redis.from_url(settings.redis.redis_url)
            commits = SemanticCommits(aclient, keys, ttl_s=60, scope_max_entries=100, max_entries=100)
            try:
                return await commits.commit("a", "key_1", answer_key)
            finally:
                await aclient.aclose()

        assert asyncio.run(commit())

        second = retriever.run(
            [
                _request("b", "When does the Café Lumière open?", semantic_scope="key_1"),
                _request("c", "When does the Café Lumière open?", semantic_scope="key_2"),  # another key
                _request("d", "How often should I oil my bicycle chain?", semantic_scope="key_1"),
                _request("e", "When does the Café Lumière open?"),  # the API did not ask
                _request(
                    "f", "When does the Café Lumière open?", semantic_scope="key_1", retrieval="lexical"
                ),
            ],
            picked_at=time.time(),
        )
        events = {}
        for rid, event in second.events:
            events.setdefault(rid, []).append(event)
        sources, done = events["b"]
        assert isinstance(sources, Sources) and sources.sources == task.sources
        assert isinstance(done, Done) and done.cached == "semantic" and done.answer == "At 7:15 [1]."
        assert done.semantic_match is not None and done.semantic_match.question == asked
        assert 0.9 <= done.semantic_match.similarity < 1.0
        assert done.timings.retrieval_ms > 0  # its own, not the earlier answer's
        # The others were searched (and go on to generation); only a lexical one was not embedded.
        assert sorted(t.request_id for t in second.to_generate) == ["c", "d", "e", "f"]
        assert [bool(client.exists(keys.semantic_pending(r))) for r in "cdef"] == [True, True, False, False]
    finally:
        for key in client.scan_iter(f"{keys.prefix}:*"):
            client.delete(key)
