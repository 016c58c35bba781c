"""Ingestion: files -> sections -> chunks -> embeddings -> a new version of a FAISS index and
its lexical (BM25) index, saved and swapped together."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import faiss
import numpy as np
from ragline.broker.config.settings import RetrievalSettings, Settings
from ragline.broker.contract.records import IndexInfo
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.pool import sync_client
from ragline.broker.state import documents, indexes, shards
from ragline.broker.state.documents import DocumentEntry
from ragline.workers.retrieval import index_store, ondisk
from ragline.workers.retrieval.chunking import Chunk, ChunkShape, chunk_document
from ragline.workers.retrieval.embedder import Embedder
from ragline.workers.retrieval.embedding_cache import EmbeddingCache
from ragline.workers.retrieval.lexical import LexicalIndex
from ragline.workers.retrieval.readers import TITLE_SEPARATOR, is_supported, read_document
from tqdm import tqdm

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IngestReport:
    info: IndexInfo
    files: int
    bytes_per_vector: float
    estimates: dict[str, int]
    # The whole ingest, and the part of it spent in the encoder itself (cache misses only).
    seconds: float = 0.0
    encode_seconds: float = 0.0
    encoded: int = 0


def iter_files(paths: Iterable[Path]) -> Iterator[tuple[Path, str]]:
    """Each readable file with its path under what was named (a file named alone: its name)."""
    for path in paths:
        if path.is_dir():
            for p in sorted(p for p in path.rglob("*") if p.is_file() and is_supported(p)):
                yield p, p.relative_to(path).as_posix()
        elif path.is_file() and is_supported(path):
            yield path, path.name
        elif not path.exists():
            raise FileNotFoundError(path)


def collect_chunks(
    paths: Iterable[Path], shape: ChunkShape, *, meta: Mapping[str, str] | None = None
) -> tuple[list[Chunk], int]:
    """Every file's chunks, each with its document's metadata: the file's front matter, ``meta``
    and ``path``. MetadataRefused (a ValueError) names a file whose metadata is past a limit."""
    chunks: list[Chunk] = []
    files = 0
    for file, relative in iter_files(paths):
        files += 1
        document = read_document(file)
        chunks.extend(
            chunk_document(document, source=str(file), path=relative, metadata=meta or {}, shape=shape)
        )
    return chunks, files


class _TimedEncoder:
    """The embedder's encode, timed: what the raw encoder takes of an ingest."""

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder
        self.seconds = 0.0
        self.count = 0

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        started = time.perf_counter()
        vectors = self._embedder.encode(texts)
        self.seconds += time.perf_counter() - started
        self.count += len(texts)
        return vectors


def embed_chunks(
    embedder: Embedder,
    chunks: list[Chunk],
    *,
    batch_size: int,
    progress: bool,
    cache: EmbeddingCache | None,
    encode: _TimedEncoder | None = None,
) -> np.ndarray:
    """Embed title path + text in batches, through the embedding cache, with a progress bar on stderr."""
    encode = encode or _TimedEncoder(embedder)
    vectors = np.empty((len(chunks), embedder.dim), dtype=np.float32)
    with tqdm(total=len(chunks), desc="embedding", unit="chunk", disable=not progress) as bar:
        for start in range(0, len(chunks), batch_size):
            texts = [c.embed_text for c in chunks[start : start + batch_size]]
            block = cache.encode(texts, encode) if cache else encode(texts)
            vectors[start : start + len(texts)] = block
            bar.update(len(texts))
    return vectors


def build_index(settings: RetrievalSettings, vectors: np.ndarray, index_type: str) -> faiss.Index:
    if index_type == "hnsw":
        params = index_store.HnswParams(
            m=settings.hnsw_m,
            ef_construction=settings.hnsw_ef_construction,
            ef_search=settings.hnsw_ef_search,
        )
        return index_store.build_hnsw(vectors, params)
    if index_type in index_store.IVF_TYPES:  # ivfpq-disk: the same index, its lists moved to disk at save
        ivf = index_store.IvfPqParams(
            nlist=settings.ivf_nlist, pq_m=settings.ivf_pq_m, refine=settings.ivf_refine
        )
        return index_store.build_ivfpq(vectors, ivf, nprobe=settings.ivf_nprobe)
    raise ValueError(f"unknown index type {index_type!r} (hnsw, ivfpq or ivfpq-disk)")


def document_id(chunk: Chunk) -> str:
    """The document a chunk belongs to (:attr:`Chunk.document_id`)."""
    return chunk.document_id


def catalog(chunks: Iterable[Chunk]) -> list[DocumentEntry]:
    """Each document of ``chunks`` once, in order of first appearance: title, path, chunk count."""
    found: dict[str, DocumentEntry] = {}
    for chunk in chunks:
        doc_id = document_id(chunk)
        entry = found.get(doc_id)
        if entry is None:
            title = chunk.title.split(TITLE_SEPARATOR)[0]
            found[doc_id] = DocumentEntry(doc_id, title, chunk.meta.get("path") or chunk.source, 1)
        else:
            found[doc_id] = replace(entry, chunks=entry.chunks + 1)
    return list(found.values())


def record_counts(info: IndexInfo, chunks: list[Chunk]) -> IndexInfo:
    """``info`` with its document count and size on disk (``GET /v1/indexes`` shows them; the API
    cannot read the index's folder), written to its meta.json too, which a worker re-registers
    from when Redis lost the registry."""
    folder = Path(info.path)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name != "meta.json")
    info = info.model_copy(update={"documents": len({document_id(c) for c in chunks}), "bytes": size})
    staged = folder / ".meta.json.tmp"
    staged.write_text(info.encode())
    os.replace(staged, folder / "meta.json")
    return info


def ingest(
    settings: Settings,
    paths: list[Path],
    *,
    index_name: str,
    index_type: str = "hnsw",
    embedder: Embedder | None = None,
    progress: bool = True,
    meta: Mapping[str, str] | None = None,
) -> IngestReport:
    started = time.perf_counter()
    chunks, files = read_chunks(settings.retrieval, paths, meta)
    client = sync_client(settings.redis)
    keys = Keys(settings.redis.key_prefix)
    if shards.lookup(client, keys, index_name) is not None:
        raise ValueError(f"index {index_name!r} is sharded: ingest it with its --shards or --shard-by")
    builder = VersionBuilder(
        settings,
        embedder or Embedder(settings.retrieval, device=settings.retrieval.ingest_encoder_device),
        progress=progress,
    )
    report = builder.build(index_name, chunks, index_type=index_type, files=files)
    return replace(report, seconds=time.perf_counter() - started)


def read_chunks(
    retrieval: RetrievalSettings, paths: list[Path], meta: Mapping[str, str] | None
) -> tuple[list[Chunk], int]:
    chunks, files = collect_chunks(paths, ChunkShape.of(retrieval), meta=meta)
    if not chunks:
        raise ValueError("no readable text found in " + ", ".join(map(str, paths)))
    return chunks, files


class VersionBuilder:
    """Embeds chunks and makes them the next version of an index: saved, listed, registered."""

    def __init__(self, settings: Settings, embedder: Embedder, *, progress: bool) -> None:
        self._settings = settings
        self._embedder = embedder
        self._progress = progress
        self.client = sync_client(settings.redis)
        self.keys = Keys(settings.redis.key_prefix)
        retrieval = settings.retrieval
        self._cache = EmbeddingCache.for_settings(
            self.client, self.keys, retrieval, model_id=embedder.model_id, dim=embedder.dim
        )

    def build(self, index_name: str, chunks: list[Chunk], *, index_type: str, files: int) -> IngestReport:
        started = time.perf_counter()
        retrieval, client, keys = self._settings.retrieval, self.client, self.keys
        encode = _TimedEncoder(self._embedder)
        vectors = embed_chunks(
            self._embedder,
            chunks,
            batch_size=retrieval.embed_batch_size,
            progress=self._progress,
            cache=self._cache,
            encode=encode,
        )
        index = build_index(retrieval, vectors, index_type)
        lexical = LexicalIndex.build([c.embed_text for c in chunks])
        info = index_store.save(
            self._settings.indexes_dir, index_name, index, chunks, index_type=index_type, lexical=lexical
        )
        info = record_counts(info, chunks)
        previous = indexes.lookup(client, keys, index_name)
        # The documents' list, then the registry: workers and the API switch only once every file
        # of the new version, and its list, is in place.
        documents.write(client, keys, index_name, info.version, catalog(chunks))
        indexes.register(client, keys, info)
        if previous is not None:
            documents.retire(client, keys, index_name, previous.version)
        index_files = (Path(info.path, "index.faiss"), Path(info.path, ondisk.LISTS))
        index_bytes = sum(p.stat().st_size for p in index_files if p.exists())
        estimates = index_store.bytes_per_vector_estimates(
            self._embedder.dim, hnsw_m=retrieval.hnsw_m, pq_m=retrieval.ivf_pq_m
        )
        return IngestReport(
            info=info,
            files=files,
            bytes_per_vector=index_bytes / len(chunks),
            estimates=estimates,
            seconds=time.perf_counter() - started,
            encode_seconds=encode.seconds,
            encoded=encode.count,
        )
