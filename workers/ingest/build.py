"""The next version of an index: the previous version's documents, less those dropped, plus the
uploaded ones, built aside, listed, then registered in one swap.

Only new chunks are embedded where the previous version keeps its exact vectors (HNSW over flat
vectors: the default): the vectors of the documents it keeps are copied out of its FAISS index,
and only the graph is built again. An IVF-PQ index keeps codes, not vectors: its kept chunks are
embedded again, through the embedding cache (hits cost a Redis read, not an encode).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, cast

import numpy as np
import redis
from ragline.broker.config.settings import RetrievalSettings, Settings
from ragline.broker.contract.messages import FailedDocument, IngestProgress, IngestResult, UploadManifest
from ragline.broker.contract.records import IndexInfo
from ragline.broker.limits.metadata import MetadataRefused
from ragline.broker.redis.keys import Keys
from ragline.broker.state import documents, indexes, shards
from ragline.workers.ingest.reading import DocumentFailed, ReaderStopped
from ragline.workers.retrieval import index_files
from ragline.workers.retrieval.chunking import Chunk, ChunkShape
from ragline.workers.retrieval.embedder import Embedder
from ragline.workers.retrieval.embedding_cache import EmbeddingCache
from ragline.workers.retrieval.ingest import build_index, catalog, document_id, record_counts
from ragline.workers.retrieval.lexical import LexicalIndex
from ragline.workers.retrieval.loaded_index import stored_vectors
from ragline.workers.retrieval.sharded_ingest import key_order, register_sharded, split
from ragline.workers.task_call import TaskCancelled, TaskRefused

# Told each step; False: the job was cancelled, stop without registering anything.
Report = Callable[[IngestProgress], bool]


class IngestRefused(TaskRefused):
    """The change cannot be made as asked; ``status`` is what the job's error says (HTTP-like)."""


class IngestCancelled(TaskCancelled):
    """The job was cancelled while it ran: nothing was registered."""


@dataclass(frozen=True, slots=True)
class Change:
    """What the next version is: the previous one less ``drop``, plus ``add``; ``failed``: the
    upload's documents left out (a replaced one keeps its previous text)."""

    add: list[Chunk]
    added_ids: list[str]
    drop: frozenset[str]
    failed: list[FailedDocument] = field(default_factory=list)


class Reader(Protocol):
    """Reads one staged file into chunks (``reading.ReaderProcess``: in a child, within a limit)."""

    def read(
        self, path: Path, *, source: str, metadata: dict[str, str], shape: ChunkShape
    ) -> list[Chunk]: ...


def staged_chunks(settings: RetrievalSettings, folder: Path, reader: Reader, report: Report) -> Change:
    """The chunks of an upload's folder (its ``manifest.json`` and files), each document's chunks
    under its id; an upload replaces documents of the same ids. A document the reader fails
    (past its time limit, say) is left out and listed; the job fails only when every one is."""
    manifest = UploadManifest.decode((folder / "manifest.json").read_bytes())
    shape = ChunkShape.of(settings)
    chunks: list[Chunk] = []
    ids: list[str] = []
    failed: list[FailedDocument] = []
    for staged in manifest.documents:
        if not report(IngestProgress(phase="reading")):
            raise IngestCancelled
        try:
            found = reader.read(folder / staged.file, source=staged.id, metadata=staged.metadata, shape=shape)
        except DocumentFailed as exc:
            failed.append(FailedDocument(id=staged.id, reason=exc.reason))
            continue
        except ReaderStopped:
            raise IngestCancelled from None
        except MetadataRefused as exc:
            # The API checked the upload's metadata; its front matter is known only now.
            raise IngestRefused(exc.status, exc.message) from None
        if not found:
            raise IngestRefused(422, f"document {staged.id!r} has no readable text")
        chunks.extend(found)
        ids.append(staged.id)
    if not ids:
        reasons = "; ".join(f"{f.id!r}: {f.reason}" for f in failed)
        raise IngestRefused(422, f"no document of the upload could be read: {reasons}")
    return Change(add=chunks, added_ids=ids, drop=frozenset(ids), failed=failed)


def _embed(
    embedder: Embedder,
    cache: EmbeddingCache,
    chunks: list[Chunk],
    *,
    batch_size: int,
    report: Report,
) -> np.ndarray:
    vectors = np.empty((len(chunks), embedder.dim), dtype=np.float32)
    for start in range(0, len(chunks), batch_size):
        texts = [c.embed_text for c in chunks[start : start + batch_size]]
        vectors[start : start + len(texts)] = cache.encode(texts, embedder.encode)
        done = start + len(texts)
        if not report(IngestProgress(phase="embedding", chunks_embedded=done, chunks_total=len(chunks))):
            raise IngestCancelled
    return vectors


def next_version(
    settings: Settings,
    client: redis.Redis,
    keys: Keys,
    embedder: Embedder,
    *,
    index: str,
    change: Change,
    report: Report,
    index_type: str = "hnsw",
) -> IngestResult:
    """Build, list and register the next version of ``index`` with ``change`` (of ``index_type``
    when it is new, else of its own); raises IngestRefused (nothing registered) when it cannot."""
    previous = indexes.lookup(client, keys, index)
    if previous is not None and previous.index_type == shards.SHARDED_TYPE:
        # The API refuses this before staging; an index sharded since the upload was accepted
        # has no files of its own to build on.
        hint = _hint(client, keys, index)
        raise IngestRefused(409, f"index {index!r} is sharded: add to it with `ragline ingest PATH {hint}`")
    kept: list[Chunk] = []
    kept_vectors: np.ndarray | None = None
    present: set[str] = set()
    if previous is not None:
        old_index, old_chunks = index_files.read_version(previous)
        index_type = previous.index_type
        present = {document_id(c) for c in old_chunks}
        rows = [i for i, c in enumerate(old_chunks) if document_id(c) not in change.drop]
        kept = [old_chunks[i] for i in rows]
        stored = stored_vectors(old_index)
        if stored is not None:
            kept_vectors = stored[rows]
    missing = sorted(change.drop - present - set(change.added_ids))
    if missing:
        raise IngestRefused(404, f"index {index!r} has no document {missing[0]!r}")
    chunks = kept + change.add
    if not chunks:
        raise IngestRefused(
            409, f"that would leave index {index!r} without documents: DELETE /v1/indexes/{index} removes it"
        )
    to_embed = change.add if kept_vectors is not None else chunks
    retrieval = settings.retrieval
    cache = EmbeddingCache.for_settings(client, keys, retrieval, model_id=embedder.model_id, dim=embedder.dim)
    if not report(IngestProgress(phase="embedding", chunks_total=len(to_embed))):
        raise IngestCancelled
    fresh = _embed(embedder, cache, to_embed, batch_size=retrieval.embed_batch_size, report=report)
    vectors = fresh if kept_vectors is None else np.concatenate([kept_vectors, fresh])
    if not report(
        IngestProgress(phase="indexing", chunks_embedded=len(to_embed), chunks_total=len(to_embed))
    ):
        raise IngestCancelled
    built = build_index(retrieval, vectors, index_type)
    lexical = LexicalIndex.build([c.embed_text for c in chunks])
    info = index_files.save(
        settings.indexes_dir, index, built, chunks, index_type=index_type, lexical=lexical
    )
    info = record_counts(info, chunks)
    entries = catalog(chunks)
    documents.write(client, keys, index, info.version, entries)
    done = IngestProgress(phase="registering", chunks_embedded=len(to_embed), chunks_total=len(to_embed))
    _swap(settings, client, keys, info, previous, report, done)
    replaced = len(present & change.drop)
    return IngestResult(
        index=index,
        version=info.version,
        documents=len(entries),
        chunks=len(chunks),
        added=len(change.added_ids),
        removed=replaced,
        embedded=len(to_embed),
        reused=len(kept) if kept_vectors is not None else 0,
    )


def _swap(
    settings: Settings,
    client: redis.Redis,
    keys: Keys,
    info: IndexInfo,
    previous: IndexInfo | None,
    report: Report,
    progress: IngestProgress,
) -> None:
    """Register ``info`` in place of ``previous``: the moment queries move to it. Undone (its
    files removed, CURRENT put back) when the job was cancelled or the index changed meanwhile."""
    expected = previous.version if previous else None
    if not report(progress):
        _undo(settings, client, keys, info, expected)
        raise IngestCancelled
    if not indexes.replace(client, keys, info, expected=expected):
        _undo(settings, client, keys, info, expected)
        raise IngestRefused(409, f"index {info.name!r} was deleted or replaced while this ran; try again")
    if previous is not None:
        documents.retire(client, keys, info.name, previous.version)


def _undo(settings: Settings, client: redis.Redis, keys: Keys, info: IndexInfo, current: str | None) -> None:
    registered = indexes.lookup(client, keys, info.name)
    index_files.discard_version(
        settings.indexes_dir, info.name, info.version, current=registered.version if registered else current
    )
    documents.retire(client, keys, info.name, info.version, ttl_s=1)


def _hint(client: redis.Redis, keys: Keys, index: str) -> str:
    shard_map = shards.lookup(client, keys, index)
    return shards.rerun_hint(shard_map) if shard_map else f"--index {index}"


def change_shards(
    settings: Settings,
    client: redis.Redis,
    keys: Keys,
    embedder: Embedder,
    *,
    shard_map: shards.ShardMap,
    change: Change,
    report: Report,
) -> IngestResult:
    """``change`` made to a sharded index, routed as an ingest splits documents: each uploaded one
    to the shard its id's hash or its shard field picks (a copy of it in another shard, its
    field's value changed since, is dropped there), each deleted one from the shards listing it.
    Then the next version of each shard it touches, one after another, and the index registered
    again over its shards, so that its version (and the result cache) follows."""
    index = shard_map.index
    if change.add and shard_map.shard_by is None and shard_map.count is None:
        raise IngestRefused(
            409,
            f"index {index!r} was sharded before its shard count was recorded: ingest these documents "
            f"once with `ragline ingest PATH --index {index} --shards N`, N the count it was made with",
        )
    try:
        parts = split(change.add, index=index, count=shard_map.count, shard_by=shard_map.shard_by)
    except ValueError as exc:
        raise IngestRefused(422, str(exc)) from None
    try:
        limit = settings.retrieval.max_shards_per_index
        shards.check_shard_count(index, shard_map.keys, parts, limit=limit)
    except shards.TooManyShards as exc:
        # The API refuses this when the upload's metadata names the values; front matter only
        # the ingest reads.
        raise IngestRefused(409, str(exc)) from None
    current = {key: indexes.lookup(client, keys, shards.shard_index(index, key)) for key in shard_map.keys}
    plan: dict[str, Change] = {}
    listed_anywhere: set[str] = set()
    for key in sorted(set(shard_map.keys) | set(parts), key=key_order):
        shard, info = shards.shard_index(index, key), current.get(key)
        listed = _listed_among(client, keys, info, change.drop) if info else frozenset()
        listed_anywhere |= listed
        add = parts.get(key, [])
        added = list(dict.fromkeys(document_id(c) for c in add))
        if not add and not listed:
            continue
        if not add and _holds_only(client, keys, info, listed):
            raise IngestRefused(
                409,
                f"that would leave shard {shard!r} of index {index!r} without documents: delete the "
                f"index (DELETE /v1/indexes/{index}) and ingest it again without them",
            )
        plan[shard] = Change(add=add, added_ids=added, drop=listed | frozenset(added))
    missing = sorted(change.drop - set(change.added_ids) - listed_anywhere)
    if missing:
        raise IngestRefused(404, f"index {index!r} has no document {missing[0]!r}")
    # A new shard (a field value, or a hash slot, no document had yet) is built as its siblings are.
    index_type = next((i.index_type for i in current.values() if i is not None), "hnsw")
    results: list[IngestResult] = []
    logical: IndexInfo | None = None
    try:
        for shard, shard_change in plan.items():
            results.append(
                next_version(
                    settings,
                    client,
                    keys,
                    embedder,
                    index=shard,
                    change=shard_change,
                    report=report,
                    index_type=index_type,
                )
            )
    finally:
        # Also when a later shard failed or the job was cancelled: a shard already swapped must
        # change the index's version. Not when the index was deleted meanwhile.
        if results and indexes.lookup(client, keys, index) is not None:
            built = {r.index for r in results}
            grown = {k for k in parts if k not in shard_map.keys and shards.shard_index(index, k) in built}
            if grown:
                every = tuple(sorted({*shard_map.keys, *grown}, key=key_order))
                shard_map = shard_map.model_copy(update={"keys": every})
                index_files.write_shard_map(settings.indexes_dir, shard_map)
            logical = register_sharded(client, keys, settings.indexes_dir, shard_map)
    if logical is None:
        raise IngestRefused(409, f"index {index!r} was deleted while this ran")
    return IngestResult(
        index=index,
        version=logical.version,
        documents=logical.documents or 0,
        chunks=logical.chunks,
        added=len(change.added_ids),
        removed=sum(r.removed for r in results),
        embedded=sum(r.embedded for r in results),
        reused=sum(r.reused for r in results),
    )


def _holds_only(client: redis.Redis, keys: Keys, info: IndexInfo | None, ids: frozenset[str]) -> bool:
    return info is not None and client.zcard(keys.document_ids(info.name, info.version)) <= len(ids)


def _listed_among(client: redis.Redis, keys: Keys, info: IndexInfo, ids: frozenset[str]) -> frozenset[str]:
    """Which of ``ids`` the version ``info`` lists."""
    if not ids:
        return frozenset()
    ordered = sorted(ids)
    found = client.hmget(keys.documents(info.name, info.version), ordered)
    return frozenset(i for i, raw in zip(ordered, found, strict=True) if raw is not None)


def remove(
    settings: Settings, client: redis.Redis, keys: Keys, *, index: str, version: str | None
) -> IngestResult:
    """The files of a deleted index (the API unregistered it already); when it was made again
    since, only the deleted version's folder. A sharded index's shards go with it."""
    registered = indexes.lookup(client, keys, index)
    shard_map = shards.lookup(client, keys, index)
    if shard_map is not None:
        if registered is not None:  # sharded again since: its shards are in use
            return IngestResult(index=index, version=None, documents=0, chunks=0, removed=0)
        return _remove_sharded(settings, client, keys, shard_map)
    removed = 0
    if version is not None:
        removed = len(_listed_ids(client, keys, index, version))
        documents.retire(client, keys, index, version, ttl_s=1)
    if registered is None:
        index_files.remove_index(settings.indexes_dir, index)
    elif version is not None and version != registered.version:
        index_files.discard_version(settings.indexes_dir, index, version, current=registered.version)
    return IngestResult(index=index, version=None, documents=0, chunks=0, removed=removed)


def _remove_sharded(
    settings: Settings, client: redis.Redis, keys: Keys, shard_map: shards.ShardMap
) -> IngestResult:
    """Every shard's files and list and the map beside them, then the registry's entries and map
    at once. Files first: a worker starting meanwhile finds no CURRENT to register a shard again
    from, and a redelivery after a crash still finds the map in Redis."""
    removed = 0
    for shard in shard_map.shards:
        info = indexes.lookup(client, keys, shard)
        if info is not None:
            removed += len(_listed_ids(client, keys, shard, info.version))
            documents.retire(client, keys, shard, info.version, ttl_s=1)
        index_files.remove_index(settings.indexes_dir, shard)
    index_files.remove_index(settings.indexes_dir, shard_map.index)
    shards.unregister(client, keys, shard_map)
    return IngestResult(index=shard_map.index, version=None, documents=0, chunks=0, removed=removed)


def _listed_ids(client: redis.Redis, keys: Keys, index: str, version: str) -> list[bytes]:
    return cast(list[bytes], client.zrange(keys.document_ids(index, version), 0, -1))  # members, not decoded
