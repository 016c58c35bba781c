"""FAISS indexes on disk: versioned folders written aside and renamed into place.

Layout: ``<home>/indexes/<name>/<version>/{index.faiss, lexical/, chunks.jsonl, meta.json}``
and ``<name>/CURRENT`` naming the live version. The dense (FAISS) and lexical (BM25) indexes of
a version are written together, so they are swapped together. Readers load whole files, so an
older version can be removed once a newer one is current; the previous one is kept for a quick
rollback. A version written before lexical indexes existed gets one built when it is loaded.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import faiss
import numpy as np
import redis

from broker import indexes, shards
from broker.indexes import IndexInfo
from broker.keys import Keys
from workers.retrieval import ondisk
from workers.retrieval.chunking import Chunk
from workers.retrieval.lexical import LexicalIndex

log = logging.getLogger(__name__)

_KEEP_VERSIONS = 2
# What save() names a version: pruning removes only folders named so, nothing else.
_VERSION_NAME = re.compile(r"\d{8}T\d{12}Z-[0-9a-f]{6}")
_FILTER_CACHE_SIZE = 256
# A filter letting through at most this many rows is searched exactly over them (a copy of their
# vectors per search); more, and the HNSW graph is searched with an ID selector.
EXACT_FILTER_MAX_ROWS = 8192


# Index types whose search takes IVF parameters (nprobe, refine factor).
IVF_TYPES = ("ivfpq", "ivfpq-disk")


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
    lexical: LexicalIndex | None = None
    _allowed: dict[str, np.ndarray] = field(default_factory=dict)

    def _params(self, knobs: SearchKnobs) -> faiss.SearchParameters | None:
        return search_parameters(self.info.index_type, knobs)

    def search_rows(
        self,
        vectors: np.ndarray,
        top_k: int,
        knobs: SearchKnobs = SearchKnobs(),
        *,
        allowed: np.ndarray | None = None,
    ) -> list[list[tuple[int, float]]]:
        """One faiss call for the whole batch of query vectors: each one's (row, cosine) best
        first; with ``allowed`` (row ids) only those rows, and as many as asked when they exist."""
        if allowed is not None:
            return self._search_allowed(vectors, top_k, knobs, allowed)
        k = min(top_k, len(self.chunks))
        params = self._params(knobs)
        scores, ids = (
            self.index.search(vectors, k, params=params) if params else self.index.search(vectors, k)
        )
        return _rows(ids, scores)

    def _search_allowed(
        self, vectors: np.ndarray, top_k: int, knobs: SearchKnobs, allowed: np.ndarray
    ) -> list[list[tuple[int, float]]]:
        k = min(top_k, len(allowed))
        if k == 0:
            return [[] for _ in range(len(vectors))]
        stored = _flat_vectors(self.index)
        if (
            stored is not None
            and len(allowed) > EXACT_FILTER_MAX_ROWS
            and isinstance(self.index, faiss.IndexHNSW)
        ):
            # Many rows pass: the graph, told which. A search that still comes back short (the
            # graph walk met too few rows that pass) is done again exactly.
            selector = faiss.IDSelectorBatch(allowed)
            ef = max(knobs.ef_search or self.index.hnsw.efSearch, 2 * k)
            scores, ids = self.index.search(
                vectors, k, params=faiss.SearchParametersHNSW(sel=selector, efSearch=ef)
            )
            rows = _rows(ids, scores)
            short = [i for i, row in enumerate(rows) if len(row) < k]
            if short:
                for i, row in zip(short, _exact(vectors[short], stored, allowed, k), strict=True):
                    rows[i] = row
            return rows
        if stored is not None:
            # Exact over the rows that pass: a graph search restricted by a selector can stop
            # short of k results when few rows pass.
            return _exact(vectors, stored, allowed, k)
        # IVF: a selector, over every list, so that each row that passes can be found.
        selector = faiss.IDSelectorBatch(allowed)
        ivf = faiss.SearchParametersIVF(sel=selector, nprobe=faiss.extract_index_ivf(self.index).nlist)
        params = faiss.IndexRefineSearchParameters(k_factor=knobs.refine_k_factor, base_index_params=ivf)
        params.sel = selector
        scores, ids = self.index.search(vectors, k, params=params)
        return _rows(ids, scores)

    def allowed(self, key: str, build: Callable[[list[Chunk]], np.ndarray]) -> np.ndarray:
        """The rows a filter lets through, computed once per filter (``key``) and version."""
        rows = self._allowed.get(key)
        if rows is None:
            rows = build(self.chunks)
            if len(self._allowed) >= _FILTER_CACHE_SIZE:
                self._allowed.pop(next(iter(self._allowed)))
            self._allowed[key] = rows
        return rows

    def search(
        self, vectors: np.ndarray, top_k: int, knobs: SearchKnobs = SearchKnobs()
    ) -> list[list[tuple[Chunk, float]]]:
        """Like :meth:`search_rows`, with the chunks themselves."""
        return [[(self.chunks[i], s) for i, s in row] for row in self.search_rows(vectors, top_k, knobs)]


def search_parameters(index_type: str, knobs: SearchKnobs) -> faiss.SearchParameters | None:
    """What a search of an index of ``index_type`` passes faiss for ``knobs`` (None: its defaults)."""
    if index_type == "hnsw" and knobs.ef_search:
        return faiss.SearchParametersHNSW(efSearch=knobs.ef_search)
    if index_type in IVF_TYPES:
        base = faiss.SearchParametersIVF(nprobe=knobs.nprobe) if knobs.nprobe else None
        return faiss.IndexRefineSearchParameters(k_factor=knobs.refine_k_factor, base_index_params=base)
    return None


def _exact(
    vectors: np.ndarray, stored: np.ndarray, allowed: np.ndarray, k: int
) -> list[list[tuple[int, float]]]:
    scores = vectors @ stored[allowed].T
    best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return _rows(allowed[best], np.take_along_axis(scores, best, axis=1))


def _rows(ids: np.ndarray, scores: np.ndarray) -> list[list[tuple[int, float]]]:
    return [
        [(int(i), float(s)) for i, s in zip(row_ids, row_scores, strict=True) if i >= 0]
        for row_ids, row_scores in zip(ids, scores, strict=True)
    ]


def _flat_vectors(index: faiss.Index) -> np.ndarray | None:
    """The vectors an HNSW-flat or flat index stores, as a view (no copy), else None."""
    storage = faiss.downcast_index(index.storage) if isinstance(index, faiss.IndexHNSW) else index
    if not isinstance(storage, faiss.IndexFlat):
        return None
    return faiss.rev_swig_ptr(storage.get_xb(), storage.ntotal * storage.d).reshape(storage.ntotal, storage.d)


def stored_vectors(index: faiss.Index) -> np.ndarray | None:
    """A copy of the exact vectors an HNSW-flat or flat index holds, row i the i-th chunk's; None
    for an index that keeps only codes (IVF-PQ: its vectors must be embedded again)."""
    stored = _flat_vectors(index)
    return None if stored is None else np.array(stored, copy=True)


def build_hnsw(vectors: np.ndarray, params: HnswParams) -> faiss.Index:
    index = empty_hnsw(vectors.shape[1], params)
    index.add(vectors)
    return index


def empty_hnsw(dim: int, params: HnswParams) -> faiss.Index:
    """An HNSW index to add vectors to, as many at a time as fit in memory."""
    index = faiss.IndexHNSWFlat(dim, params.m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = params.ef_construction
    index.hnsw.efSearch = params.ef_search
    return index


_MIN_POINTS_PER_CENTROID = 39  # below this faiss' k-means warns and clusters poorly


def ivf_nlist(n: int, params: IvfPqParams) -> int:
    """The inverted lists an IVF-PQ index of ``n`` vectors gets."""
    nlist = params.nlist or int(4 * np.sqrt(n))
    return max(1, min(nlist, n // _MIN_POINTS_PER_CENTROID))


def ivfpq_spec(n: int, dim: int, params: IvfPqParams) -> str:
    nlist = ivf_nlist(n, params)
    if dim % params.pq_m:
        raise ValueError(f"ivf_pq_m={params.pq_m} must divide the embedding dimension {dim}")
    # 8-bit codes need 256·39 training points; small corpora get fewer bits per code.
    nbits = int(max(1, min(8, np.floor(np.log2(max(2, n // _MIN_POINTS_PER_CENTROID))))))
    refine = {"sq8": "Refine(SQ8)", "flat": "Refine(Flat)"}[params.refine]
    return f"IVF{nlist},PQ{params.pq_m}x{nbits},{refine}"


def build_ivfpq(vectors: np.ndarray, params: IvfPqParams, *, nprobe: int) -> faiss.Index:
    """IVF-PQ for the candidates, re-ranked by SQ8 or exact vectors: far less memory than HNSW."""
    index = trained_ivfpq(vectors, len(vectors), params, nprobe=nprobe)
    index.add(vectors)
    return index


def trained_ivfpq(sample: np.ndarray, n: int, params: IvfPqParams, *, nprobe: int) -> faiss.Index:
    """An empty IVF-PQ index sized for ``n`` vectors, trained on ``sample`` (all of them, or a
    random part when they do not fit in memory at once), to add them to in parts."""
    index = faiss.index_factory(
        sample.shape[1], ivfpq_spec(n, sample.shape[1], params), faiss.METRIC_INNER_PRODUCT
    )
    index.train(sample)
    faiss.extract_index_ivf(index).nprobe = nprobe
    return index


def bytes_per_vector_estimates(dim: int, *, hnsw_m: int, pq_m: int) -> dict[str, int]:
    """What each index type costs per vector (ids and graph links included), for the ingest report."""
    return {
        "flat": 4 * dim,
        "hnsw": 4 * dim + 2 * hnsw_m * 4,
        "ivfpq+sq8": pq_m + 8 + dim,
        "ivfpq+flat": pq_m + 8 + 4 * dim,
        # lists and refine codes on disk (the page cache holds what searches touch)
        "ivfpq-disk": 0,
    }


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(text)
    os.replace(tmp, path)


def save(
    root: Path,
    name: str,
    index: faiss.Index,
    chunks: list[Chunk],
    *,
    index_type: str = "hnsw",
    lexical: LexicalIndex | None = None,
) -> IndexInfo:
    """Persist a new version of ``name`` and make it CURRENT; returns its description."""
    indexes.check_index_name(name)  # a folder of root's own, never a path out of it
    # Sortable to the microsecond: pruning keeps the newest by name.
    version = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ") + "-" + uuid.uuid4().hex[:6]
    base = root / name
    base.mkdir(parents=True, exist_ok=True)
    staging = base / f".tmp-{version}"
    staging.mkdir()
    if index_type == "ivfpq-disk":
        ondisk.move_lists_to_disk(index, staging)
    faiss.write_index(index, str(staging / "index.faiss"))
    if lexical is not None:
        lexical.save(staging / "lexical")
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


def discard_version(root: Path, name: str, version: str, *, current: str | None) -> None:
    """Undo a save of ``version`` that was never registered: CURRENT names ``current`` again
    (the version still registered; None: CURRENT is removed) and the version's folder goes."""
    base = root / name
    if current is not None and (base / current).is_dir():
        _write_atomic(base / "CURRENT", current)
    else:
        (base / "CURRENT").unlink(missing_ok=True)
    shutil.rmtree(base / version, ignore_errors=True)


def remove_index(root: Path, name: str) -> None:
    """Every file of index ``name``: CURRENT first, so that no worker re-registers it meanwhile."""
    indexes.check_index_name(name)
    base = root / name
    (base / "CURRENT").unlink(missing_ok=True)
    shutil.rmtree(base, ignore_errors=True)


def read_version(info: IndexInfo) -> tuple[faiss.Index, list[Chunk]]:
    """A version's FAISS index and chunks, row for row (what an ingest builds the next one from)."""
    path = Path(info.path)
    index = _read_index(info)
    with (path / "chunks.jsonl").open() as src:
        chunks = [_chunk(json.loads(line)) for line in src]
    return index, chunks


def _read_index(info: IndexInfo) -> faiss.Index:
    return read_faiss(Path(info.path), info.index_type)


def read_faiss(folder: Path, index_type: str) -> faiss.Index:
    """The FAISS index saved in a version's ``folder``, as a worker serves it."""
    if index_type == "ivfpq-disk":
        return ondisk.read(folder)
    return faiss.read_index(str(folder / "index.faiss"))


def current_on_disk(root: Path) -> list[IndexInfo]:
    """Every index's CURRENT version found on disk (to re-register after a Redis restart)."""
    found = []
    for current in sorted(root.glob("*/CURRENT")):
        meta = current.parent / current.read_text().strip() / "meta.json"
        if meta.exists():
            found.append(IndexInfo(**json.loads(meta.read_text())))
    return found


_SHARD_MAP = "SHARDS.json"


def write_shard_map(root: Path, shard_map: shards.ShardMap) -> None:
    """A sharded index's map beside its shards (``<name>/SHARDS.json``), so a worker can register
    it again after Redis lost the registry."""
    base = root / shards.check_logical_name(shard_map.index)
    base.mkdir(parents=True, exist_ok=True)
    _write_atomic(base / _SHARD_MAP, shard_map.encode())


def shard_maps_on_disk(root: Path) -> list[shards.ShardMap]:
    return [shards.ShardMap.decode(p.read_text()) for p in sorted(root.glob(f"*/{_SHARD_MAP}"))]


def load(info: IndexInfo, *, ef_search: int) -> LoadedIndex:
    path = Path(info.path)
    index = _read_index(info)
    if isinstance(index, faiss.IndexHNSW):
        index.hnsw.efSearch = ef_search
    with (path / "chunks.jsonl").open() as src:
        chunks = [_chunk(json.loads(line)) for line in src]
    if (path / "lexical").is_dir():
        lexical = LexicalIndex.load(path / "lexical", len(chunks))
    else:
        log.info("index %s version %s has no lexical index: building one", info.name, info.version)
        lexical = LexicalIndex.build([c.embed_text for c in chunks])
    return LoadedIndex(info=info, index=index, chunks=chunks, lexical=lexical)


def _chunk(row: dict[str, object]) -> Chunk:
    # Versions written before section-aware chunking have neither anchors nor metadata.
    anchors = row.pop("anchors", ())
    return Chunk(**row, anchors=tuple(anchors))  # type: ignore[arg-type]


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
        if info is None or info.index_type == shards.SHARDED_TYPE:
            # Deleted (DELETE /v1/indexes/{name}): its memory goes with it. A sharded index has no
            # files of its own to load (its shards do; this is one whose shard map is gone).
            self._loaded.pop(name, None)
            raise UnknownIndex(name)
        if loaded is None or loaded.info.version != info.version:
            with self._lock:  # one thread loads; the others keep serving the old version
                loaded = self._loaded.get(name)
                if loaded is None or loaded.info.version != info.version:
                    loaded = load(info, ef_search=self._ef_search)
                    self._loaded[name] = loaded
        self._checked_at[name] = now
        return loaded
