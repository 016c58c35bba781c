"""bench/scale/shards_index.py: rows split by document as an ingest splits them, and the served
indexes, built on a tiny corpus, hold every row once with its own vector."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from ragline.broker.config.settings import Settings
from ragline.broker.state import shards
from ragline.workers.retrieval import index_store
from ragline.workers.retrieval.ingest import document_id

from bench.scale.data import Corpus
from bench.scale.shards_index import (
    CHUNKS_PER_DOCUMENT,
    PLAIN,
    SHARD_COUNTS,
    ensure_indexes,
    placeholder_chunks,
    served_home,
    shard_of_rows,
    sharded_name,
)

CONFIGS = (PLAIN, *(sharded_name(c) for c in SHARD_COUNTS))


def test_rows_split_by_document_as_an_ingest_splits_them() -> None:
    chunks = placeholder_chunks(0, 10 * CHUNKS_PER_DOCUMENT)
    assert [int(c.chunk_id[1:]) for c in chunks] == list(range(len(chunks)))
    of = shard_of_rows(chunks, 4)
    for chunk, key in zip(chunks, of, strict=True):
        assert str(key) == shards.hash_shard(document_id(chunk), 4)
    by_document = of.reshape(-1, CHUNKS_PER_DOCUMENT)
    assert (by_document == by_document[:, :1]).all()  # a document is never split
    assert (shard_of_rows(chunks, 1) == 0).all()
    with pytest.raises(ValueError, match="empty"):
        shard_of_rows(placeholder_chunks(0, CHUNKS_PER_DOCUMENT), 2)  # one document, two shards


@pytest.mark.model  # FAISS indexes built here
def test_the_served_indexes_hold_each_row_once_with_its_own_vector(tmp_path: Path) -> None:
    corpus = Corpus(n=2000, clusters=20)
    settings = Settings(home=tmp_path / "home")
    built = ensure_indexes(tmp_path / "root", corpus, settings)
    assert set(built) == set(CONFIGS)
    root = served_home(tmp_path / "root", corpus, settings.retrieval) / "indexes"
    vectors = corpus.head(corpus.n)
    maps = {m.index: m for m in index_store.shard_maps_on_disk(root)}
    assert {name: m.count for name, m in maps.items()} == {"scale1": 1, "scale2": 2, "scale4": 4}
    infos = {info.name: info for info in index_store.current_on_disk(root)}
    for name in (PLAIN, *(s for m in maps.values() for s in m.shards)):
        assert name in infos, name
    for shard_map in (None, *maps.values()):
        names = [PLAIN] if shard_map is None else list(shard_map.shards)
        rows: list[int] = []
        for name in names:
            index, chunks = index_store.read_version(infos[name])
            mine = [int(c.chunk_id[1:]) for c in chunks]
            assert index.ntotal == len(mine) == infos[name].chunks
            assert np.allclose(index.reconstruct_n(0, index.ntotal), vectors[mine])
            rows += mine
        assert sorted(rows) == list(range(corpus.n))
    # A second call builds nothing.
    assert ensure_indexes(tmp_path / "root", corpus, settings) == built
    assert json.loads((root.parent / "built.json").read_text()) == built
