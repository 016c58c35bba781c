"""Versioned index folders: atomic CURRENT, pruning, registry follow-up in the worker cache."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import redis
from ragline.broker.contract.messages import PrefixMatch
from ragline.broker.contract.records import IndexInfo
from ragline.broker.redis.keys import Keys
from ragline.broker.state import indexes
from ragline.workers.retrieval import index_store
from ragline.workers.retrieval.chunking import Chunk
from ragline.workers.retrieval.search import allowed_rows


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


# -- a document's metadata, stored once (issue 32) -------------------------------------------------


def _documents(n_docs: int, per_doc: int, meta_bytes: int) -> list[Chunk]:
    """``n_docs`` documents of ``per_doc`` chunks each, every document's chunks sharing its
    metadata (as chunk_sections makes them), of about ``meta_bytes`` bytes."""
    chunks = []
    for d in range(n_docs):
        meta = {"path": f"doc-{d}.md", "team": f"team-{d % 2}", "notes": "n" * meta_bytes}
        chunks += [
            Chunk(f"d{d}-{i}", f"doc-{d}.md", "T", f"text {d} {i}", ("t",), meta) for i in range(per_doc)
        ]
    return chunks


def _chunk_bytes(info: IndexInfo) -> int:
    return sum(p.stat().st_size for p in Path(info.path).glob("*.jsonl"))


def test_a_documents_metadata_is_stored_once_however_many_chunks_it_has(tmp_path: Path) -> None:
    index, _, _ = _index()  # 20 vectors: 2 documents of 10 chunks
    bare = index_store.save(tmp_path, "bare", index, _documents(2, 10, 0))
    rich = index_store.save(tmp_path, "rich", index, _documents(2, 10, 4096))
    # Copied into every chunk, 8 KiB of metadata would cost 80 KiB; stored once, 8 KiB.
    assert _chunk_bytes(rich) - _chunk_bytes(bare) < 2 * 2 * 4096
    loaded = index_store.load(rich, ef_search=32)
    assert [c.meta for c in loaded.chunks] == [c.meta for c in _documents(2, 10, 4096)]
    assert len({id(c.meta) for c in loaded.chunks}) == 2
    # Filters see it as before.
    rows = allowed_rows(loaded.chunks, {"team": "team-1", "path": PrefixMatch(prefix="doc-")})
    assert rows.tolist() == list(range(10, 20))


def test_a_version_written_before_documents_were_stored_once_loads_with_its_metadata(tmp_path: Path) -> None:
    """The previous release wrote each chunk's metadata on its row, and no documents.jsonl."""
    index, _, vectors = _index()
    chunks = _documents(2, 10, 100)
    info = index_store.save(tmp_path, "old", index, chunks)
    folder = Path(info.path)
    (folder / "documents.jsonl").unlink()
    rows = [
        {
            "chunk_id": c.chunk_id,
            "source": c.source,
            "title": c.title,
            "text": c.text,
            "anchors": list(c.anchors),
            "meta": dict(c.meta),
        }
        for c in chunks
    ]
    (folder / "chunks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    loaded = index_store.load(info, ef_search=32)
    assert loaded.chunks == chunks
    assert len({id(c.meta) for c in loaded.chunks}) == 2  # held once per document in memory too
    assert allowed_rows(loaded.chunks, {"team": "team-0"}).tolist() == list(range(10))
    assert loaded.search(vectors[:1], top_k=1)[0][0][0].chunk_id == "d0-0"

    # The next version built on it is written in the new layout.
    _, read = index_store.read_version(info)
    again = index_store.save(tmp_path, "old", index, read)
    assert "meta" not in (Path(again.path) / "chunks.jsonl").read_text()
    assert len((Path(again.path) / "documents.jsonl").read_text().splitlines()) == 2
