"""FAISS indexes, for callers that want them from one place (bench/, ``ragline eval``, ingest).
They live in four modules, one per concern:

- ``index_builders``: building an index from vectors (HNSW, IVF-PQ) and what each costs;
- ``index_files``: the on-disk layout, versions written aside and swapped in (``save``, ``load``);
- ``loaded_index``: a version in memory and its search (``LoadedIndex``, ``SearchKnobs``);
- ``index_cache``: the versions a worker has loaded, following the registry (``IndexCache``).
"""

from __future__ import annotations

from ragline.workers.retrieval.index_builders import (
    HnswParams,
    IvfPqParams,
    build_hnsw,
    build_ivfpq,
    bytes_per_vector_estimates,
    empty_hnsw,
    ivf_nlist,
    ivfpq_spec,
    trained_ivfpq,
)
from ragline.workers.retrieval.index_cache import IndexCache, UnknownIndex
from ragline.workers.retrieval.index_files import (
    current_on_disk,
    discard_version,
    load,
    read_faiss,
    read_version,
    remove_index,
    save,
    shard_maps_on_disk,
    write_shard_map,
)
from ragline.workers.retrieval.loaded_index import (
    EXACT_FILTER_MAX_ROWS,
    IVF_TYPES,
    LoadedIndex,
    SearchKnobs,
    search_parameters,
    stored_vectors,
)

__all__ = [
    "EXACT_FILTER_MAX_ROWS",
    "IVF_TYPES",
    "HnswParams",
    "IndexCache",
    "IvfPqParams",
    "LoadedIndex",
    "SearchKnobs",
    "UnknownIndex",
    "build_hnsw",
    "build_ivfpq",
    "bytes_per_vector_estimates",
    "current_on_disk",
    "discard_version",
    "empty_hnsw",
    "ivf_nlist",
    "ivfpq_spec",
    "load",
    "read_faiss",
    "read_version",
    "remove_index",
    "save",
    "search_parameters",
    "shard_maps_on_disk",
    "stored_vectors",
    "trained_ivfpq",
    "write_shard_map",
]
