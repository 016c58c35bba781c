"""bench/scale/run.py's indexes: built block by block with ragline's own builders and knobs, and
cached under ``<home>/bench-scale/`` in folders named by what they were built from.

No build holds the corpus' float vectors: HNSW and IVF-PQ take them a block at a time, IVF-PQ
trains on a sample (its k-means would subsample a larger one anyway), and ``ivfpq-disk`` writes
its lists to disk as they fill. What does stay in memory while building is the index itself
(for ``ivfpq-disk``, its refine codes, written once every vector is in).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import faiss
import numpy as np
from ragline.broker.config.settings import RetrievalSettings, Settings
from ragline.workers.retrieval import index_store, ondisk

from bench.scale.data import Corpus, exact_top_k

TYPES = ("hnsw", "ivfpq", "ivfpq-disk")
# Training points per inverted list: above faiss' 39 (its warning), below its 256 (where its
# k-means subsamples anyway).
_TRAIN_PER_LIST = 64
TOP_K = 10


@dataclass(frozen=True)
class Built:
    folder: Path
    index_type: str
    build_s: float  # training (IVF: once for both IVF types) plus adding
    build_peak_rss_gb: float  # of the process that built it (training included)
    cached: bool

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.folder.iterdir() if p.is_file())


def hnsw_params(settings: RetrievalSettings) -> index_store.HnswParams:
    return index_store.HnswParams(settings.hnsw_m, settings.hnsw_ef_construction, settings.hnsw_ef_search)


def ivfpq_params(settings: RetrievalSettings) -> index_store.IvfPqParams:
    return index_store.IvfPqParams(settings.ivf_nlist, settings.ivf_pq_m, settings.ivf_refine)


def knobs(settings: RetrievalSettings) -> index_store.SearchKnobs:
    """The search effort a worker applies when a request names none."""
    return index_store.SearchKnobs(
        ef_search=settings.hnsw_ef_search,
        nprobe=settings.ivf_nprobe,
        refine_k_factor=settings.ivf_refine_k_factor,
    )


def estimated_bytes(index_type: str, corpus: Corpus, settings: RetrievalSettings) -> int:
    """Memory the build needs for the index (the on-disk one holds its refine codes until the end)."""
    per_vector = index_store.bytes_per_vector_estimates(
        corpus.dim, hnsw_m=settings.hnsw_m, pq_m=settings.ivf_pq_m
    )
    key = "hnsw" if index_type == "hnsw" else f"ivfpq+{settings.ivf_refine}"
    return per_vector[key] * corpus.n


def _train_size(corpus: Corpus, settings: RetrievalSettings) -> int:
    return min(corpus.n, _TRAIN_PER_LIST * index_store.ivf_nlist(corpus.n, ivfpq_params(settings)))


def index_key(index_type: str, corpus: Corpus, settings: RetrievalSettings) -> str:
    if index_type == "hnsw":
        return f"{corpus.key}-hnsw-m{settings.hnsw_m}-efc{settings.hnsw_ef_construction}"
    p = ivfpq_params(settings)
    spec = index_store.ivfpq_spec(corpus.n, corpus.dim, p)
    spec = spec.replace(",", "-").replace("(", "-").replace(")", "")  # a plain folder name
    return f"{corpus.key}-{index_type}-{spec}-train{_train_size(corpus, settings)}"


def cached(root: Path, index_type: str, corpus: Corpus, settings: RetrievalSettings) -> Built | None:
    folder = root / index_key(index_type, corpus, settings)
    if not (folder / "meta.json").exists():
        return None
    meta = json.loads((folder / "meta.json").read_text())
    return Built(folder, index_type, meta["build_s"], meta["build_peak_rss_gb"], cached=True)


def ensure_built(root: Path, index_type: str, corpus: Corpus, settings: RetrievalSettings) -> Built:
    """The index from the cache, or built now, in this process (and cached)."""
    if (found := cached(root, index_type, corpus, settings)) is not None:
        return found
    folder = root / index_key(index_type, corpus, settings)
    staging = root / f".tmp-{folder.name}-{uuid.uuid4().hex[:6]}"
    staging.mkdir(parents=True)
    try:
        build_s = _build(staging, index_type, corpus, settings, root)
        peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
        meta = {"build_s": build_s, "build_peak_rss_gb": peak_gb, "built_at": time.time()}
        (staging / "meta.json").write_text(json.dumps(meta))
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Built(folder, index_type, build_s, peak_gb, cached=False)


def build_command(root: Path, index_type: str, corpus: Corpus) -> list[str]:
    """The command that builds (and caches) one index in a process of its own, so that its peak
    memory is its own and faiss' C-level output is flushed before the report is printed."""
    cmd = [sys.executable, "-m", "bench.scale.index", str(root), index_type]
    return cmd + [f"--{name}={value}" for name, value in asdict(corpus).items()]


def _build(staging: Path, index_type: str, corpus: Corpus, settings: RetrievalSettings, root: Path) -> float:
    if index_type == "hnsw":
        started = time.perf_counter()
        index = index_store.empty_hnsw(corpus.dim, hnsw_params(settings))
        train_s = 0.0
    else:
        index, train_s = _trained(root, corpus, settings)
        started = time.perf_counter()
        if index_type == "ivfpq-disk":
            ondisk.stream_lists_to_disk(index, staging)
    for first, rows in corpus.blocks():
        index.add(rows)
        print(f"  {index_type}: {first + len(rows)}/{corpus.n} added", flush=True)
    if index_type == "ivfpq-disk":
        ondisk.finish_streamed_lists(index, staging)
    faiss.write_index(index, str(staging / "index.faiss"))
    return train_s + time.perf_counter() - started


def _trained(root: Path, corpus: Corpus, settings: RetrievalSettings) -> tuple[faiss.Index, float]:
    """The empty, trained IVF-PQ index both IVF types start from (cached), and its training time."""
    key = index_key("ivfpq", corpus, settings).replace("-ivfpq-", "-trained-")
    path, meta = root / f"{key}.faiss", root / f"{key}.json"
    if not meta.exists():
        size = _train_size(corpus, settings)
        print(f"  training IVF-PQ on {size} vectors", flush=True)
        started = time.perf_counter()
        index = index_store.trained_ivfpq(
            corpus.head(size), corpus.n, ivfpq_params(settings), nprobe=settings.ivf_nprobe
        )
        train_s = time.perf_counter() - started
        faiss.write_index(index, str(path))
        meta.write_text(json.dumps({"train_s": train_s}))
    return faiss.read_index(str(path)), json.loads(meta.read_text())["train_s"]


@dataclass(frozen=True)
class Truth:
    queries: Path  # .npy, float32 (count, dim)
    top_k: Path  # .npy, int64 (count, TOP_K)
    seconds: float
    cached: bool


def ensure_truth(root: Path, corpus: Corpus, count: int) -> Truth:
    """Held-out queries and their exact top-k over the whole corpus (cached)."""
    base = root / f"{corpus.key}-truth-q{count}"
    queries, top_k, meta = (
        base.with_name(f"{base.name}.{ext}") for ext in ("queries.npy", "top.npy", "json")
    )
    if meta.exists():
        return Truth(queries, top_k, json.loads(meta.read_text())["seconds"], cached=True)
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    q = corpus.queries(count)
    np.save(queries, q)
    np.save(top_k, exact_top_k(corpus, q, TOP_K))
    seconds = time.perf_counter() - started
    meta.write_text(json.dumps({"seconds": seconds, **asdict(corpus)}))
    return Truth(queries, top_k, seconds, cached=False)


def main() -> int:
    parser = argparse.ArgumentParser(description="Build one of bench/scale/run.py's indexes into its cache.")
    parser.add_argument("root", type=Path)
    parser.add_argument("index_type", choices=TYPES)
    for name, kind in (("n", int), ("dim", int), ("clusters", int), ("spread", float), ("seed", int)):
        parser.add_argument(f"--{name}", type=kind, required=True)
    args = parser.parse_args()
    corpus = Corpus(n=args.n, dim=args.dim, clusters=args.clusters, spread=args.spread, seed=args.seed)
    ensure_built(args.root, args.index_type, corpus, Settings().retrieval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
