"""IVF-PQ with refine, in memory and on disk: builds on small corpora, and per-query nprobe /
efSearch are honoured."""

from __future__ import annotations

import uuid
from pathlib import Path

import faiss
import numpy as np
import pytest
from ragline.broker.config.settings import Settings
from ragline.broker.contract.records import IndexInfo
from ragline.workers.retrieval import index_store, loaded_index, ondisk
from ragline.workers.retrieval.chunking import Chunk
from ragline.workers.retrieval.embedder import Embedder


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, list[Chunk]]:
    rng = np.random.default_rng(1)
    centers = rng.normal(size=(20, 32))
    x = (centers[rng.integers(0, 20, 3000)] + 0.3 * rng.normal(size=(3000, 32))).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x, [Chunk(f"c{i}", "s", "t", "x") for i in range(len(x))]


@pytest.mark.model  # builds FAISS indexes
@pytest.mark.parametrize("refine", ["sq8", "flat"])
def test_ivfpq_refine_recall(data: tuple[np.ndarray, list[Chunk]], refine: str) -> None:
    x, chunks = data
    index = index_store.build_ivfpq(x, index_store.IvfPqParams(nlist=0, pq_m=8, refine=refine), nprobe=8)
    loaded = index_store.LoadedIndex(
        IndexInfo(name="n", version="v", path="/p", chunks=len(x), dim=32, index_type="ivfpq"), index, chunks
    )
    hits = loaded.search(x[:50], 1, index_store.SearchKnobs(nprobe=16, refine_k_factor=16))
    # a sanity bound on toy data; bench/retrieval.py measures recall on the real corpus
    assert sum(h[0][0].chunk_id == f"c{i}" for i, h in enumerate(hits)) >= 43


def test_spec_adapts_to_small_corpora() -> None:
    params = index_store.IvfPqParams(nlist=0, pq_m=48, refine="sq8")
    assert index_store.ivfpq_spec(8984, 384, params) == "IVF230,PQ48x7,Refine(SQ8)"
    assert index_store.ivfpq_spec(1_000_000, 384, params) == "IVF4000,PQ48x8,Refine(SQ8)"
    with pytest.raises(ValueError):
        index_store.ivfpq_spec(1000, 384, index_store.IvfPqParams(nlist=0, pq_m=50, refine="sq8"))


@pytest.mark.model  # builds FAISS indexes
def test_hnsw_ef_search_per_query(data: tuple[np.ndarray, list[Chunk]]) -> None:
    x, chunks = data
    index = index_store.build_hnsw(x, index_store.HnswParams(16, 40, 16))
    loaded = index_store.LoadedIndex(
        IndexInfo(name="n", version="v", path="/p", chunks=len(x), dim=32), index, chunks
    )
    low = loaded.search(x[:20], 10, index_store.SearchKnobs(ef_search=10))
    high = loaded.search(x[:20], 10, index_store.SearchKnobs(ef_search=200))
    assert len(low[0]) == len(high[0]) == 10


@pytest.mark.model  # builds FAISS indexes
@pytest.mark.parametrize("index_type", ["hnsw", "hnsw-selector", "ivfpq"])
def test_filtered_search_is_exact_in_count(
    data: tuple[np.ndarray, list[Chunk]], index_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However few rows a filter lets through, a search returns min(k, rows) of them, best first."""
    x, chunks = data
    if index_type == "hnsw-selector":  # the graph with an ID selector, as for broad filters
        monkeypatch.setattr(loaded_index, "EXACT_FILTER_MAX_ROWS", 0)
        index_type = "hnsw"
    if index_type == "hnsw":
        index = index_store.build_hnsw(x, index_store.HnswParams(16, 40, 16))
    else:
        index = index_store.build_ivfpq(x, index_store.IvfPqParams(nlist=0, pq_m=8, refine="flat"), nprobe=1)
    loaded = index_store.LoadedIndex(
        IndexInfo(name="n", version="v", path="/p", chunks=len(x), dim=32, index_type=index_type),
        index,
        chunks,
    )
    exact = x[:5] @ x.T
    for allowed in (np.array([7, 1500, 2999]), np.arange(0, 3000, 97)):
        rows = loaded.search_rows(x[:5], 10, index_store.SearchKnobs(), allowed=allowed)
        for q, found in enumerate(rows):
            assert len(found) == min(10, len(allowed))
            assert {r for r, _ in found} <= set(allowed.tolist())
            best = allowed[np.argsort(-exact[q, allowed])][: len(found)]
            assert [r for r, _ in found][:3] == best.tolist()[:3]
    assert loaded.search_rows(x[:2], 5, allowed=np.array([], dtype=np.int64)) == [[], []]


@pytest.mark.model  # builds FAISS indexes
def test_ivfpq_disk_answers_as_in_memory_from_a_moved_folder(
    data: tuple[np.ndarray, list[Chunk]], tmp_path: Path
) -> None:
    """ivfpq-disk: the same index with its lists in a file beside it; read back from a version
    folder that has moved since (a rename, another mount), it answers as the index in memory did."""
    x, chunks = data
    params = index_store.IvfPqParams(nlist=0, pq_m=8, refine="sq8")
    knobs = index_store.SearchKnobs(nprobe=16, refine_k_factor=16)
    in_memory = index_store.build_ivfpq(x, params, nprobe=8)
    expected = index_store.LoadedIndex(
        IndexInfo(name="n", version="v", path="/p", chunks=len(x), dim=32, index_type="ivfpq"),
        in_memory,
        chunks,
    )
    want = expected.search_rows(x[:20], 10, knobs)
    rows = np.arange(0, 3000, 97)
    want_filtered = expected.search_rows(x[:5], 10, knobs, allowed=rows)

    built = index_store.build_ivfpq(x, params, nprobe=8)
    info = index_store.save(tmp_path / "a", "n", built, chunks, index_type="ivfpq-disk")
    assert (Path(info.path) / ondisk.LISTS).stat().st_size > 0
    moved = tmp_path / "b"
    (tmp_path / "a").rename(moved)
    info = info.model_copy(update={"path": str(moved / "n" / info.version)})

    loaded = index_store.load(info, ef_search=16)
    lists = faiss.extract_index_ivf(loaded.index).invlists
    assert isinstance(faiss.downcast_InvertedLists(lists), faiss.OnDiskInvertedLists)
    assert loaded.search_rows(x[:20], 10, knobs) == want
    assert loaded.search_rows(x[:5], 10, knobs, allowed=rows) == want_filtered
    index, read_chunks = index_store.read_version(info)  # what the next version is built from
    assert index.ntotal == len(x) and len(read_chunks) == len(x)


@pytest.mark.model  # builds FAISS indexes
def test_lists_streamed_to_disk_answer_as_in_memory(
    data: tuple[np.ndarray, list[Chunk]], tmp_path: Path
) -> None:
    """An index trained on a sample, its vectors added in parts straight to on-disk lists, then
    packed: read back, it answers as the same index built in memory, and no slack is left."""
    x, _ = data
    params = index_store.IvfPqParams(nlist=0, pq_m=8, refine="sq8")
    trained = faiss.serialize_index(index_store.trained_ivfpq(x[:2000], len(x), params, nprobe=8))
    in_memory = faiss.deserialize_index(trained)
    in_memory.add(x)
    streamed = faiss.deserialize_index(trained)
    ondisk.stream_lists_to_disk(streamed, tmp_path)
    for start in range(0, len(x), 700):
        streamed.add(x[start : start + 700])
    ondisk.finish_streamed_lists(streamed, tmp_path)
    faiss.write_index(streamed, str(tmp_path / "index.faiss"))
    del streamed

    ivf = faiss.extract_index_ivf(in_memory)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.faiss", ondisk.LISTS, ondisk.LISTS_META]
    assert (tmp_path / ondisk.LISTS).stat().st_size == len(x) * (ivf.code_size + 8)  # codes and ids
    knobs = index_store.SearchKnobs(nprobe=16, refine_k_factor=16)
    search_params = index_store.search_parameters("ivfpq-disk", knobs)
    read = index_store.read_faiss(tmp_path, "ivfpq-disk")
    np.testing.assert_array_equal(
        read.search(x[:20], 10, params=search_params)[1],
        in_memory.search(x[:20], 10, params=search_params)[1],
    )


@pytest.mark.integration
def test_ingest_builds_ivfpq_disk_and_serves_the_planted_passage(
    settings: Settings, corpus: Path, embedder: Embedder
) -> None:
    from ragline.workers.retrieval.ingest import ingest

    name = f"disk-{uuid.uuid4().hex[:8]}"
    report = ingest(
        settings, [corpus], index_name=name, index_type="ivfpq-disk", embedder=embedder, progress=False
    )
    assert report.info.index_type == "ivfpq-disk"
    assert "ivfpq-disk" in report.estimates and report.bytes_per_vector > 0
    loaded = index_store.load(report.info, ef_search=16)
    query = embedder.encode(["When does Café Lumière open?"])
    hits = loaded.search(query, 3, index_store.SearchKnobs(refine_k_factor=1000))
    assert "Lumière" in hits[0][0][0].text
