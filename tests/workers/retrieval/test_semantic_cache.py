"""The semantic cache's lookup on a narrow fake of its Redis store: the threshold, the scopes,
answers the result cache has let go, keeping up with a scope's stream, and what a worker holds.
The store itself on a real Redis: tests/broker/state/test_semantic_cache.py; the lookup in a
real batch: tests/workers/retrieval/test_batch.py; through the stack:
tests/api/query/test_semantic_cache.py."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from ragline.broker.contract.messages import CachedAnswer, Source
from ragline.broker.state.semantic_cache import Entry, Pending, ScopeRead
from ragline.workers.retrieval.index_builders import HnswParams
from ragline.workers.retrieval.semantic_cache import Probe, SemanticCache

DIM = 8
ANSWER = CachedAnswer(
    answer="Use copy.deepcopy.",
    cached=True,
    sources=[Source(chunk_id="c", source="copy.rst", title="copy", text="deepcopy", score=0.8)],
)


def unit(*values: float) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(values)] = values
    return v / np.linalg.norm(v)


def at_similarity(s: float) -> np.ndarray:
    """A unit vector whose cosine similarity with ``unit(1)`` is ``s``."""
    return unit(s, float(np.sqrt(1 - s * s)))


class FakeStore:
    """Scopes as lists of entries, answers in a dict; records what is read and proposed."""

    def __init__(self) -> None:
        self.scopes: dict[str, list[Entry]] = {}
        self.bodies: dict[str, bytes] = {}
        self.reads: list[dict[str, str]] = []
        self.proposed: list[Pending] = []

    def remember(
        self, scope: str, question: str, vector: np.ndarray, answer: CachedAnswer | None = ANSWER
    ) -> None:
        entries = self.scopes.setdefault(scope, [])
        key = f"qc:{scope}:{len(entries)}"
        entries.append(Entry(f"{len(entries) + 1}-0", question, vector.astype(np.float32).tobytes(), key))
        if answer is not None:
            self.bodies[key] = answer.encode().encode()

    def read(self, after: dict[str, str]) -> dict[str, ScopeRead]:
        self.reads.append(dict(after))
        out = {}
        for scope, last in after.items():
            entries = self.scopes.get(scope)
            if entries is None:
                out[scope] = ScopeRead(False, [])
                continue
            start = int(last.split("-")[0]) if last else 0
            out[scope] = ScopeRead(True, entries[start:])
        return out

    def answers(self, answer_keys: Sequence[str]) -> list[bytes | None]:
        return [self.bodies.get(k) for k in answer_keys]

    def propose(self, misses: Sequence[Pending]) -> None:
        self.proposed += misses


def cache(
    store: FakeStore, *, threshold: float = 0.9, scope_max: int = 100, loaded: int = 8
) -> SemanticCache:
    return SemanticCache(
        store,
        dim=DIM,
        threshold=threshold,
        hnsw=HnswParams(m=16, ef_construction=40, ef_search=16),
        scope_max_entries=scope_max,
        loaded_scopes=loaded,
    )


def probe(rid: str, vector: np.ndarray, scope: str = "s1", question: str = "asked") -> Probe:
    return Probe(rid, scope, question, vector)


def test_a_question_at_or_above_the_threshold_is_answered_with_its_nearest_ones_answer() -> None:
    store = FakeStore()
    store.remember("s1", "How do I deep-copy a list?", unit(1))
    store.remember("s1", "How do I sort a list?", unit(0, 1))
    hits = cache(store, threshold=0.9).lookup(
        [probe("a", at_similarity(0.95)), probe("b", at_similarity(0.9))]
    )
    assert set(hits) == {"a", "b"}
    assert hits["a"].question == "How do I deep-copy a list?"
    assert abs(hits["a"].similarity - 0.95) < 1e-4
    assert hits["a"].answer == ANSWER
    assert store.proposed == []


def test_below_the_threshold_is_a_miss_proposed_with_its_question_and_embedding() -> None:
    store = FakeStore()
    store.remember("s1", "How do I deep-copy a list?", unit(1))
    vector = at_similarity(0.85)
    assert cache(store, threshold=0.9).lookup([probe("a", vector, question="copy vs deepcopy?")]) == {}
    [pending] = store.proposed
    assert (pending.request_id, pending.scope, pending.question) == ("a", "s1", "copy vs deepcopy?")
    assert np.array_equal(np.frombuffer(pending.vector, dtype=np.float32), vector)


def test_only_the_probes_own_scope_answers_it() -> None:
    store = FakeStore()
    store.remember("other-key", "How do I deep-copy a list?", unit(1))
    semantic = cache(store)
    assert semantic.lookup([probe("a", unit(1), scope="mine")]) == {}
    assert [p.scope for p in store.proposed] == ["mine"]
    assert set(semantic.lookup([probe("b", unit(1), scope="other-key")])) == {"b"}


def test_an_empty_or_unknown_scope_misses() -> None:
    store = FakeStore()
    store.scopes["empty"] = []
    hits = cache(store).lookup([probe("a", unit(1), scope="empty"), probe("b", unit(1), scope="unknown")])
    assert hits == {}
    assert {p.request_id for p in store.proposed} == {"a", "b"}


def test_an_answer_the_result_cache_let_go_is_a_miss() -> None:
    store = FakeStore()
    store.remember("s1", "How do I deep-copy a list?", unit(1), answer=None)
    assert cache(store).lookup([probe("a", unit(1))]) == {}
    assert [p.request_id for p in store.proposed] == ["a"]


def test_an_answer_that_does_not_decode_is_a_miss() -> None:
    store = FakeStore()
    store.remember("s1", "How do I deep-copy a list?", unit(1))
    store.bodies["qc:s1:0"] = b'{"answer": "x", "field_of_a_later_release": 1, "sources": []}'
    assert cache(store).lookup([probe("a", unit(1))]) == {}


def test_each_lookup_reads_only_the_entries_after_the_last_one_held() -> None:
    store = FakeStore()
    store.remember("s1", "first", unit(1))
    semantic = cache(store)
    semantic.lookup([probe("a", unit(0, 1))])
    store.remember("s1", "second", unit(0, 1))
    hits = semantic.lookup([probe("b", unit(0, 1))])
    assert store.reads == [{"s1": ""}, {"s1": "1-0"}]
    assert hits["b"].question == "second"


def test_a_scope_whose_stream_is_gone_is_dropped() -> None:
    store = FakeStore()
    store.remember("s1", "How do I deep-copy a list?", unit(1))
    semantic = cache(store)
    assert set(semantic.lookup([probe("a", unit(1))])) == {"a"}
    del store.scopes["s1"]  # expired, or removed for the budget; the answer may still be cached
    assert semantic.lookup([probe("b", unit(1))]) == {}
    assert store.reads[-1] == {"s1": "1-0"}
    store.scopes["s1"] = []
    semantic.lookup([probe("c", unit(1))])
    assert store.reads[-1] == {"s1": ""}  # read whole again: nothing of the old one was kept


def test_a_scope_grown_to_twice_the_streams_cap_is_read_again_whole() -> None:
    store = FakeStore()
    semantic = cache(store, scope_max=2)
    for i in range(4):
        store.remember("s1", f"q{i}", unit(1, i))
        semantic.lookup([probe(f"r{i}", unit(0, 0, 1))])
    assert store.reads[-1] == {"s1": "3-0"}
    semantic.lookup([probe("again", unit(0, 0, 1))])
    assert store.reads[-1] == {"s1": ""}


def test_a_worker_holds_at_most_its_loaded_scopes_least_recently_used_out_first() -> None:
    store = FakeStore()
    for scope in ("a", "b", "c"):
        store.remember(scope, scope, unit(1))
    semantic = cache(store, loaded=2)
    for scope in ("a", "b", "a", "c"):  # "b" is the least recently used when "c" comes
        semantic.lookup([probe(f"r-{scope}", unit(1), scope=scope)])
    semantic.lookup([probe("r-a2", unit(1), scope="a")])
    semantic.lookup([probe("r-b2", unit(1), scope="b")])
    assert store.reads[-2] == {"a": "1-0"}  # still held
    assert store.reads[-1] == {"b": ""}  # read again whole


def test_one_round_trip_reads_every_scope_of_a_batch() -> None:
    store = FakeStore()
    store.remember("a", "qa", unit(1))
    store.remember("b", "qb", unit(1))
    hits = cache(store).lookup(
        [probe("1", unit(1), scope="a"), probe("2", unit(1), scope="b"), probe("3", unit(1), scope="a")]
    )
    assert set(hits) == {"1", "2", "3"}
    assert store.reads == [{"a": "", "b": ""}]
