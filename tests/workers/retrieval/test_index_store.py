"""Versioned index folders: atomic CURRENT, pruning, registry follow-up in the worker cache."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import redis

from broker import indexes
from broker.keys import Keys
from workers.retrieval import index_store
from workers.retrieval.chunking import Chunk


def _index(n: int = 20, dim: int = 8) -> tuple[object, list[Chunk], np.ndarray]:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    chunks = [Chunk(f"c{i:03d}", "doc.md", "T", f"text {i}") for i in range(n)]
    return index_store.build_hnsw(vectors, index_store.HnswParams(16, 40, 32)), chunks, vectors


def test_save_load_search_and_prune(tmp_path: Path) -> None:
    index, chunks, vectors = _index()
    infos = [index_store.save(tmp_path, "docs", index, chunks) for _ in range(3)]
    versions = sorted(p.name for p in (tmp_path / "docs").iterdir() if p.is_dir())
    assert versions == sorted(i.version for i in infos[1:])  # the two newest are kept
    assert (tmp_path / "docs" / "CURRENT").read_text() == infos[-1].version
    assert [i.version for i in index_store.current_on_disk(tmp_path)] == [infos[-1].version]

    loaded = index_store.load(infos[-1], ef_search=32)
    hits = loaded.search(vectors[:2], top_k=3)
    assert [h[0][0].chunk_id for h in hits] == ["c000", "c001"]
    assert hits[0][0][1] > 0.99


def test_cache_follows_the_registry(tmp_path: Path, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = Keys(f"ragline-test-{uuid.uuid4().hex[:6]}")
    index, chunks, _ = _index()
    first = index_store.save(tmp_path, "docs", index, chunks)
    indexes.register(client, keys, first)
    cache = index_store.IndexCache(client, keys, ef_search=32, recheck_s=0.0)
    assert cache.get("docs").info.version == first.version

    second = index_store.save(tmp_path, "docs", index, chunks[:10] + chunks[10:])
    indexes.register(client, keys, second)
    assert cache.get("docs").info.version == second.version
    try:
        cache.get("missing")
    except index_store.UnknownIndex:
        pass
    else:
        raise AssertionError("unknown index must raise")


def test_prune_removes_only_its_own_versions(tmp_path: Path) -> None:
    """Whatever else sits in an index's folder (sorting before any version) outlives pruning, and
    a link is never followed out of it."""
    index, chunks, _ = _index()
    base, outside = tmp_path / "indexes" / "docs", tmp_path / "outside"
    for folder in (base / "0001-mine", outside / "0002-theirs"):
        folder.mkdir(parents=True)
        (folder / "keep.txt").write_text("keep")
    (base / "0000-link").symlink_to(outside / "0002-theirs", target_is_directory=True)
    infos = [index_store.save(tmp_path / "indexes", "docs", index, chunks) for _ in range(3)]
    left = sorted(p.name for p in base.iterdir() if p.is_dir())
    assert left == ["0000-link", "0001-mine", *sorted(i.version for i in infos[1:])]
    assert (base / "0001-mine" / "keep.txt").exists() and (outside / "0002-theirs" / "keep.txt").exists()


def test_save_refuses_a_name_that_leaves_the_root(tmp_path: Path) -> None:
    index, chunks, _ = _index()
    root = tmp_path / "indexes"
    root.mkdir()
    for name in ("..", "../x", "/abs", "a/b", "."):
        try:
            index_store.save(root, name, index, chunks)
        except indexes.InvalidIndexName as exc:
            assert repr(name) in str(exc)
        else:
            raise AssertionError(f"saved an index named {name!r}")
    assert list(tmp_path.iterdir()) == [root] and list(root.iterdir()) == []
