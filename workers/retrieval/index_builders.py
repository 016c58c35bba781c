"""Building FAISS indexes from vectors: HNSW over flat vectors (the default), or IVF-PQ with a
refine stage (far less memory), sized for the corpus; and what each costs per vector."""

from __future__ import annotations

from dataclasses import dataclass

import faiss
import numpy as np


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
