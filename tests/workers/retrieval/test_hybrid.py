"""Dense, lexical and hybrid retrieval, diversity and metadata filters on a real small index."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import PrefixMatch, RetrieveRequest, Source, Sources
from ragline.broker.redis.keys import Keys
from ragline.workers.retrieval import index_store
from ragline.workers.retrieval.batch import BatchRetriever
from ragline.workers.retrieval.embedding_cache import EmbeddingCache
from ragline.workers.retrieval.index_store import IndexCache
from ragline.workers.retrieval.ingest import ingest

from tests.helpers import batch_retriever

pytestmark = pytest.mark.integration

INDEX = "hybrid-test"
# One long section about espresso (several chunks of one section), two more sections of the same
# file, a file with a made-up identifier only lexical search can match, and front matter.
SHOTS = " ".join(
    f"Grind the coffee beans finely and tamp them evenly before pulling espresso shot {i}." for i in range(40)
)
ESPRESSO = (
    f"# Espresso guide\n\n## Pulling a shot\n\n{SHOTS}\n\n## Milk\n\nSteam the milk for a cappuccino.\n\n"
    "## Cleaning\n\nBackflush the espresso machine weekly.\n"
)
DOCS = {
    "coffee/espresso.md": ESPRESSO,
    "coffee/beans.md": "---\nlang: fr\n---\n# Beans\n\nArabica beans taste sweeter than robusta beans.\n",
    "tools/flush.md": "# Flush tool\n\nRun zqxflush_v2 to purge the descaling cache of the espresso machine.",
    "tea.md": "# Tea\n\nGreen tea steeps for two minutes at 80 degrees.\n",
}


@pytest.fixture(scope="module")
def hybrid_index(settings: Settings, embedder, tmp_path_factory: pytest.TempPathFactory) -> str:
    corpus = tmp_path_factory.mktemp("hybrid-corpus")
    for name, text in DOCS.items():
        (corpus / name).parent.mkdir(parents=True, exist_ok=True)
        (corpus / name).write_text(text)
    ingest(settings, [corpus], index_name=INDEX, embedder=embedder, progress=False, meta={"team": "cafe"})
    return INDEX


def _ask(retriever: BatchRetriever, *requests: dict) -> list[list[Source]]:
    batch = [
        RetrieveRequest(
            request_id=f"r{i}", mode="retrieval", index=INDEX, enqueued_at=time.time(), **{"top_k": 5, **r}
        )
        for i, r in enumerate(requests)
    ]
    result = retriever.run(batch, picked_at=time.time())
    by_id = {rid: e.sources for rid, e in result.events if isinstance(e, Sources)}
    return [by_id[f"r{i}"] for i in range(len(batch))]


def test_modes_in_one_batch(settings: Settings, embedder, hybrid_index: str) -> None:
    q = "how do I run zqxflush_v2"
    dense, lexical, hybrid, default = _ask(
        batch_retriever(settings, embedder),
        {"query": q, "retrieval": "dense"},
        {"query": q, "retrieval": "lexical"},
        {"query": q, "retrieval": "hybrid"},
        {"query": q},
    )
    assert lexical[0].source.endswith("tools/flush.md")
    assert all(s.source.endswith("flush.md") for s in lexical)  # only chunks sharing a word
    assert hybrid[0].source.endswith("tools/flush.md")
    assert [s.chunk_id for s in default] == [s.chunk_id for s in hybrid]  # the default mode is hybrid
    assert len(dense) == len(hybrid) == 5
    assert hybrid[0].title == "Flush tool" and hybrid[0].anchor == "flush-tool"


def test_diversity_caps_chunks_per_section_and_file(settings: Settings, embedder, hybrid_index: str) -> None:
    q = "how finely should I grind coffee beans for an espresso shot"
    retriever = batch_retriever(settings, embedder, max_chunks_per_file=2)
    [diverse, raw] = _ask(retriever, {"query": q}, {"query": q, "diversity": False})
    sections = [(s.source, s.anchor) for s in raw]
    assert len(sections) > len(set(sections))  # without diversity: one section several times
    diverse_sections = [(s.source, s.anchor) for s in diverse]
    assert len(diverse_sections) == len(set(diverse_sections)) == 5
    assert sum(s.source.endswith("espresso.md") for s in diverse) == 2
    assert diverse[0].title == "Espresso guide › Pulling a shot"


@pytest.mark.parametrize("mode", ["dense", "hybrid", "lexical"])
def test_filters_stay_exact_in_count(settings: Settings, embedder, hybrid_index: str, mode: str) -> None:
    retriever = batch_retriever(settings, embedder)
    q = "espresso machine"
    coffee, french, team, none, few = _ask(
        retriever,
        {"query": q, "retrieval": mode, "filter": {"path": PrefixMatch(prefix="coffee/")}, "top_k": 4},
        {"query": "coffee beans", "retrieval": mode, "filter": {"lang": "fr"}},
        {"query": q, "retrieval": mode, "filter": {"team": ["cafe", "bar"]}, "top_k": 3},
        {"query": q, "retrieval": mode, "filter": {"team": "bar"}},
        {"query": q, "retrieval": mode, "filter": {"path": ["tools/flush.md", "tea.md"]}, "top_k": 10},
    )
    assert all("/coffee/" in s.source for s in coffee)
    assert [s.source.endswith("beans.md") for s in french] == [True]
    assert len(team) == 3 and none == []
    if mode == "lexical":  # only chunks that share a word with the query
        assert [s.source.rsplit("/", 1)[-1] for s in few] == ["flush.md"]
        assert 1 <= len(coffee) <= 4
    else:  # exactly top_k, or every chunk that passes when fewer do
        assert sorted(s.source.rsplit("/", 1)[-1] for s in few) == ["flush.md", "tea.md"]
        assert len(coffee) == 4


def test_a_version_without_a_lexical_index_gets_one_when_loaded(
    settings: Settings, hybrid_index: str
) -> None:
    client = redis.Redis.from_url(settings.redis.redis_url)
    info = index_store.IndexCache(client, Keys(settings.redis.key_prefix), ef_search=16).get(INDEX).info
    loaded = index_store.load(info, ef_search=16)
    legacy = Path(info.path, "lexical")
    renamed = legacy.with_name(f"lexical-{uuid.uuid4().hex}")
    legacy.rename(renamed)
    try:
        rebuilt = index_store.load(info, ef_search=16)
    finally:
        renamed.rename(legacy)
    assert rebuilt.lexical is not None and loaded.lexical is not None
    assert rebuilt.lexical.search(["zqxflush_v2"], 3) == loaded.lexical.search(["zqxflush_v2"], 3)


def test_the_reranking_stage_reorders_the_first_candidates(
    settings: Settings, embedder, hybrid_index: str
) -> None:
    """A real CrossEncoder loaded from a local folder: the packaged MiniLM with a fresh scoring
    head (no cross-encoder's weights install from a registry), so its order means nothing, but
    the stage's loading, its one call per batch and its reordering are the ones a trained model gets."""
    from ragline.workers.retrieval.embedder import embedding_model_path
    from ragline.workers.retrieval.rerank import Reranker

    reranker = Reranker(embedding_model_path(settings.retrieval), threads=1)
    s = settings.replace(reranker_candidates=4)
    client = redis.Redis.from_url(s.redis.redis_url)
    keys = Keys(s.redis.key_prefix)
    cache = EmbeddingCache(client, keys, model_id=embedder.model_id, dim=embedder.dim, ttl_s=60)
    retriever = BatchRetriever(
        s.retrieval, embedder, cache, IndexCache(client, keys, ef_search=16), reranker=reranker
    )
    q = "espresso machine cleaning"
    [plain] = _ask(batch_retriever(settings, embedder), {"query": q, "diversity": False, "top_k": 6})
    [reranked] = _ask(retriever, {"query": q, "diversity": False, "top_k": 6})
    head = plain[:4]
    expected = sorted(
        zip(reranker.score([(q, f"{c.title}\n{c.text}") for c in head]), head, strict=True),
        key=lambda p: -p[0],
    )
    assert [c.chunk_id for c in reranked[:4]] == [c.chunk_id for _, c in expected]
    assert [c.score for c in reranked[:4]] == pytest.approx([score for score, _ in expected], abs=1e-5)
    assert [c.chunk_id for c in reranked[4:]] == [c.chunk_id for c in plain[4:]]
