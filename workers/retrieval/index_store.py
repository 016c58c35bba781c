"""FAISS indexes on disk: versioned folders written aside and renamed into place.

Layout: ``<home>/indexes/<name>/<version>/{index.faiss, chunks.jsonl, meta.json}`` and
``<name>/CURRENT`` naming the live version. Readers load whole files, so an older version can
be removed once a newer one is current; the previous one is kept for a quick rollback.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import faiss
import numpy as np
import redis

from broker import indexes
from broker.indexes import IndexInfo
from broker.keys import Keys
from workers.retrieval.chunking import Chunk

_KEEP_VERSIONS = 2


class UnknownIndex(LookupError):
    pass


@dataclass(frozen=True, slots=True)
class HnswParams:
    m: int
    ef_construction: int
    ef_search: int


@dataclass(slots=True)
class LoadedIndex:
    info: IndexInfo
    index: faiss.Index
    chunks: list[Chunk]

    def search(self, vectors: np.ndarray, top_k: int) -> list[list[tuple[Chunk, float]]]:
        k = min(top_k, len(self.chunks))
        scores, ids = self.index.search(vectors, k)
        return [
            [(self.chunks[i], float(s)) for i, s in zip(row_ids, row_scores, strict=True) if i >= 0]
            for row_ids, row_scores in zip(ids, scores, strict=True)
        ]


def build_hnsw(vectors: np.ndarray, params: HnswParams) -> faiss.Index:
    index = faiss.IndexHNSWFlat(vectors.shape[1], params.m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = params.ef_construction
    index.hnsw.efSearch = params.ef_search
    index.add(vectors)
    return index


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(text)
    os.replace(tmp, path)


def save(
    root: Path, name: str, index: faiss.Index, chunks: list[Chunk], *, index_type: str = "hnsw"
) -> IndexInfo:
    """Persist a new version of ``name`` and make it CURRENT; returns its description."""
    version = time.strftime("%Y%m%d%H%M%S") + "-" + uuid.uuid4().hex[:6]
    base = root / name
    base.mkdir(parents=True, exist_ok=True)
    staging = base / f".tmp-{version}"
    staging.mkdir()
    faiss.write_index(index, str(staging / "index.faiss"))
    with (staging / "chunks.jsonl").open("w") as out:
        for chunk in chunks:
            out.write(json.dumps(asdict(chunk)) + "\n")
    info = IndexInfo(
        name=name,
        version=version,
        path=str(base / version),
        chunks=len(chunks),
        dim=index.d,
        index_type=index_type,
    )
    (staging / "meta.json").write_text(json.dumps(asdict(info)))
    staging.rename(base / version)
    _write_atomic(base / "CURRENT", version)
    _prune(base, keep=version)
    return info


def _prune(base: Path, *, keep: str) -> None:
    versions = sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))
    for old in versions[:-_KEEP_VERSIONS]:
        if old.name != keep:
            shutil.rmtree(old, ignore_errors=True)


def current_on_disk(root: Path) -> list[IndexInfo]:
    """Every index's CURRENT version found on disk (to re-register after a Redis restart)."""
    found = []
    for current in sorted(root.glob("*/CURRENT")):
        meta = current.parent / current.read_text().strip() / "meta.json"
        if meta.exists():
            found.append(IndexInfo(**json.loads(meta.read_text())))
    return found


def load(info: IndexInfo, *, ef_search: int) -> LoadedIndex:
    path = Path(info.path)
    index = faiss.read_index(str(path / "index.faiss"))
    if hasattr(index, "hnsw"):
        index.hnsw.efSearch = ef_search
    with (path / "chunks.jsonl").open() as src:
        chunks = [Chunk(**json.loads(line)) for line in src]
    return LoadedIndex(info=info, index=index, chunks=chunks)


class IndexCache:
    """The worker's loaded indexes; follows the registry so a re-ingest is picked up live."""

    def __init__(self, client: redis.Redis, keys: Keys, *, ef_search: int, recheck_s: float = 0.5) -> None:
        self._client = client
        self._keys = keys
        self._ef_search = ef_search
        self._recheck_s = recheck_s
        self._loaded: dict[str, LoadedIndex] = {}
        self._checked_at: dict[str, float] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> LoadedIndex:
        now = time.monotonic()
        loaded = self._loaded.get(name)
        if loaded is not None and now - self._checked_at.get(name, 0.0) < self._recheck_s:
            return loaded
        info = indexes.lookup(self._client, self._keys, name)
        if info is None:
            raise UnknownIndex(name)
        if loaded is None or loaded.info.version != info.version:
            with self._lock:  # one thread loads; the others keep serving the old version
                loaded = self._loaded.get(name)
                if loaded is None or loaded.info.version != info.version:
                    loaded = load(info, ef_search=self._ef_search)
                    self._loaded[name] = loaded
        self._checked_at[name] = now
        return loaded
