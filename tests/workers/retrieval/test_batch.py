"""A retrieval batch on real MiniLM + FAISS: one encode, per-request top_k, early exit both ways."""

from __future__ import annotations

import time

import pytest

from broker.contract import Degradation, Done, Error, RetrieveRequest
from broker.settings import Settings
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
