"""One index measured in a process of its own (started by bench/scale/run.py): the resident memory
its loading and searching add, recall@10 against the exact top-10, and search latency for single
queries and for batches. Prints one JSON line (a :class:`Probe`).

    .venv/bin/python -m bench.scale.probe FOLDER INDEX_TYPE QUERIES.npy TOP.npy [--warm-up 100]

Searched as a retrieval worker searches for a top-10 request: ``RAGLINE_RETRIEVAL_CANDIDATES``
deep (at least twice the top 10: ``search_depth``), with the worker's default knobs;
recall@10 is of the first 10. IVF's refine re-ranks ``RAGLINE_IVF_REFINE_K_FACTOR`` times that
depth, so a search only 10 deep would refine far fewer candidates than a worker does.

The index's files are dropped from the page cache first (clean pages only, no privileges
needed), so that an on-disk index starts from the disk, however recently it was built; an
untimed warm-up of queries other than the timed ones follows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import faiss
import numpy as np
from ragline.broker.config.settings import Settings
from ragline.workers.retrieval import index_store
from ragline.workers.retrieval.search import search_depth

from bench.scale.data import recall_at
from bench.scale.index import TOP_K, knobs

BATCH = 32


@dataclass(frozen=True)
class Probe:
    load_s: float
    rss_load_gb: float  # what loading the index added
    rss_gb: float  # what loading and every search added
    rss_file_gb: float  # of rss_gb, pages of memory-mapped files (the kernel may drop them again)
    recall_at_10: float
    single_p50_ms: float
    single_p99_ms: float
    batch_p50_ms: float  # a whole batch of BATCH queries
    batch_p99_ms: float


def _rss() -> dict[str, int]:
    """This process' resident memory in bytes: total, anonymous and file-backed."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon", "RssFile"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


def drop_from_page_cache(folder: Path) -> None:
    for path in folder.iterdir():
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _percentiles(seconds: list[float]) -> tuple[float, float]:
    p50, p99 = np.percentile(np.array(seconds) * 1000, [50, 99])
    return float(p50), float(p99)


def probe(folder: Path, index_type: str, queries: np.ndarray, truth: np.ndarray, *, warm_up: int) -> Probe:
    settings = Settings().retrieval
    # As a retrieval worker sets it (workers/retrieval/batch.py).
    faiss.cvar.distance_compute_blas_threshold = settings.faiss_blas_threshold
    params = index_store.search_parameters(index_type, knobs(settings))
    drop_from_page_cache(folder)
    before = _rss()
    started = time.perf_counter()
    index = index_store.read_faiss(folder, index_type)
    load_s = time.perf_counter() - started
    loaded = _rss()

    depth = search_depth(settings.retrieval_candidates, TOP_K)

    def search(q: np.ndarray) -> np.ndarray:
        found = index.search(q, depth, params=params)[1] if params else index.search(q, depth)[1]
        return found[:, :TOP_K]

    # The warm-up's queries are the last ones, never timed; the timed ones are all the others.
    timed, warm = queries[: len(queries) - warm_up], queries[len(queries) - warm_up :]
    for q in warm:
        search(q[None])
    found, single = [], []
    for q in timed:
        started = time.perf_counter()
        found.append(search(q[None])[0])
        single.append(time.perf_counter() - started)
    batches = []
    for start in range(0, len(timed) - BATCH + 1, BATCH):
        started = time.perf_counter()
        search(timed[start : start + BATCH])
        batches.append(time.perf_counter() - started)
    after = _rss()
    gb = 1 / 1e9
    return Probe(
        load_s=load_s,
        rss_load_gb=(loaded["VmRSS"] - before["VmRSS"]) * gb,
        rss_gb=(after["VmRSS"] - before["VmRSS"]) * gb,
        rss_file_gb=(after["RssFile"] - before["RssFile"]) * gb,
        recall_at_10=recall_at(np.array(found), truth[: len(timed)]),
        single_p50_ms=_percentiles(single)[0],
        single_p99_ms=_percentiles(single)[1],
        batch_p50_ms=_percentiles(batches)[0] if batches else float("nan"),
        batch_p99_ms=_percentiles(batches)[1] if batches else float("nan"),
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path)
    parser.add_argument("index_type")
    parser.add_argument("queries", type=Path)
    parser.add_argument("top", type=Path)
    parser.add_argument("--warm-up", type=int, default=100)
    args = parser.parse_args()
    queries, truth = np.load(args.queries), np.load(args.top)
    if not 0 <= args.warm_up < len(queries):
        raise SystemExit(f"--warm-up must leave some of the {len(queries)} queries to time")
    result = probe(args.folder, args.index_type, queries, truth, warm_up=args.warm_up)
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
