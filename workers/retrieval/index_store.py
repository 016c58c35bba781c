"""FAISS indexes on disk: versioned folders written aside and renamed into place.

Layout: ``<home>/indexes/<name>/<version>/{index.faiss, chunks.jsonl, meta.json}`` and
``<name>/CURRENT`` naming the live version. Readers load whole files, so an older version can
be removed once a newer one is current; the previous one is kept for a quick rollback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import faiss
import numpy as np
import redis

from broker import indexes
from broker.indexes import IndexInfo
from broker.keys import Keys
from workers.retrieval.chunking import Chunk

_KEEP_VERSIONS = 2
# What save() names a version: pruning removes only folders named so, nothing else.
_VERSION_NAME = re.compile(r"\d{8}T\d{12}Z-[0-9a-f]{6}")


class UnknownIndex(LookupError):
    pass


@dataclass(frozen=True, slots=True)
class HnswParams:
    m: int
    ef_construction: int
    ef_search: int


@dataclass(frozen=True, slots=True)
class IvfPqParams:
    nlist: int  # 0: derived from the corpus size
    pq_m: int
    refine: str  # "sq8" or "flat"


@dataclass(frozen=True, slots=True)
class SearchKnobs:
    """Per-search effort: HNSW's efSearch, IVF's nprobe and refine factor (None: the index's own)."""

    ef_search: int | None = None
    nprobe: int | None = None
    refine_k_factor: float = 4.0


@dataclass(slots=True)
class LoadedIndex:
    info: IndexInfo
    index: faiss.Index
    chunks: list[Chunk]

    def _params(self, knobs: SearchKnobs) -> faiss.SearchParameters | None:
        if self.info.index_type == "hnsw" and knobs.ef_search:
            return faiss.SearchParametersHNSW(efSearch=knobs.ef_search)
        if self.info.index_type == "ivfpq":
            base = faiss.SearchParametersIVF(nprobe=knobs.nprobe) if knobs.nprobe else None
            return faiss.IndexRefineSearchParameters(k_factor=knobs.refine_k_factor, base_index_params=base)
        return None

    def search(
        self, vectors: np.ndarray, top_k: int, knobs: SearchKnobs = SearchKnobs()
    ) -> list[list[tuple[Chunk, float]]]:
        """One faiss call for the whole batch of query vectors."""
        k = min(top_k, len(self.chunks))
        params = self._params(knobs)
        scores, ids = (
            self.index.search(vectors, k, params=params) if params else self.index.search(vectors, k)
        )
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


_MIN_POINTS_PER_CENTROID = 39  # below this faiss' k-means warns and clusters poorly


def ivfpq_spec(n: int, dim: int, params: IvfPqParams) -> str:
    nlist = params.nlist or int(4 * np.sqrt(n))
    nlist = max(1, min(nlist, n // _MIN_POINTS_PER_CENTROID))
    if dim % params.pq_m:
        raise ValueError(f"ivf_pq_m={params.pq_m} must divide the embedding dimension {dim}")
    # 8-bit codes need 256·39 training points; small corpora get fewer bits per code.
    nbits = int(max(1, min(8, np.floor(np.log2(max(2, n // _MIN_POINTS_PER_CENTROID))))))
    refine = {"sq8": "Refine(SQ8)", "flat": "Refine(Flat)"}[params.refine]
    return f"IVF{nlist},PQ{params.pq_m}x{nbits},{refine}"


def build_ivfpq(vectors: np.ndarray, params: IvfPqParams, *, nprobe: int) -> faiss.Index:
    """IVF-PQ for the candidates, re-ranked by SQ8 or exact vectors: far less memory than HNSW."""
    index = faiss.index_factory(
        vectors.shape[1], ivfpq_spec(len(vectors), vectors.shape[1], params), faiss.METRIC_INNER_PRODUCT
    )
    index.train(vectors)
    index.add(vectors)
    faiss.extract_index_ivf(index).nprobe = nprobe
    return index


def bytes_per_vector_estimates(dim: int, *, hnsw_m: int, pq_m: int) -> dict[str, int]:
    """What each index type costs per vector (ids and graph links included), for the ingest report."""
    return {
        "flat": 4 * dim,
        "hnsw": 4 * dim + 2 * hnsw_m * 4,
        "ivfpq+sq8": pq_m + 8 + dim,
        "ivfpq+flat": pq_m + 8 + 4 * dim,
    }


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(text)
    os.replace(tmp, path)


def save(
    root: Path, name: str, index: faiss.Index, chunks: list[Chunk], *, index_type: str = "hnsw"
) -> IndexInfo:
    """Persist a new version of ``name`` and make it CURRENT; returns its description."""
    indexes.check_index_name(name)  # a folder of root's own, never a path out of it
    # Sortable to the microsecond: pruning keeps the newest by name.
    version = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ") + "-" + uuid.uuid4().hex[:6]
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
    versions = sorted(
        p for p in base.iterdir() if _VERSION_NAME.fullmatch(p.name) and p.is_dir() and not p.is_symlink()
    )
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
    if isinstance(index, faiss.IndexHNSW):
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

    def get(self, name: str, *, version: str | None = None) -> LoadedIndex:
        """The current version of ``name``; ``version`` (what the API saw) forces a recheck if unseen."""
        now = time.monotonic()
        loaded = self._loaded.get(name)
        fresh = now - self._checked_at.get(name, 0.0) < self._recheck_s
        if loaded is not None and (loaded.info.version == version or (version is None and fresh)):
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
