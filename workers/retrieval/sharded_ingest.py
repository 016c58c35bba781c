"""Ingesting a sharded index: the chunks split by shard, each shard a version of its own index.

An ingest replaces the shards its documents fall into and leaves every other shard as it is,
live: re-ingesting the documents of one shard (one year, one tenant) swaps only that shard. The
logical index's entry is registered after its shards, with a version naming theirs, so the API's
cached answers of the previous shards are not served again.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import redis
from ragline.broker.config.settings import Settings
from ragline.broker.contract.records import IndexInfo
from ragline.broker.redis.keys import Keys
from ragline.broker.redis.pool import sync_client
from ragline.broker.state import indexes, shards
from ragline.workers.retrieval import index_store
from ragline.workers.retrieval.chunking import Chunk
from ragline.workers.retrieval.embedder import Embedder
from ragline.workers.retrieval.ingest import IngestReport, VersionBuilder, document_id, read_chunks


@dataclass(frozen=True, slots=True)
class ShardedReport:
    info: IndexInfo  # the logical index's entry
    shard_map: shards.ShardMap
    built: dict[str, IngestReport]  # by shard index name: the shards this ingest replaced
    files: int
    seconds: float


def split(
    chunks: list[Chunk], *, index: str, count: int | None, shard_by: str | None
) -> dict[str, list[Chunk]]:
    """The chunks by shard key: the hash of each one's document id over ``count`` shards, or its
    document's value of the metadata field ``shard_by``. ValueError for a chunk without that
    field, or a value that makes no valid shard name."""
    parts: dict[str, list[Chunk]] = {}
    for chunk in chunks:
        if shard_by is None:
            assert count is not None
            key = shards.hash_shard(document_id(chunk), count)
        else:
            value = chunk.meta.get(shard_by)
            if not value:
                raise ValueError(f"document {document_id(chunk)!r} has no {shard_by!r} to shard by")
            key = value
        parts.setdefault(key, []).append(chunk)
    for key in parts:
        shards.shard_index(index, key)  # InvalidIndexName (a ValueError) names the value
    return parts


def key_order(key: str) -> tuple[bool, int, str]:
    return (not key.isdigit(), int(key) if key.isdigit() else 0, key)


def planned_map(
    client: redis.Redis, keys: Keys, index: str, *, count: int | None, shard_by: str | None
) -> shards.ShardMap | None:
    """The index's current map, when this ingest may add to it; ValueError when it is a plain
    index, or sharded another way (re-sharding is a new index)."""
    current = shards.lookup(client, keys, index)
    registered = indexes.lookup(client, keys, index)
    if current is None:
        if registered is not None:
            raise ValueError(f"index {index!r} is not sharded: delete it first, or use another name")
        return None
    if current.shard_by != shard_by:
        way = f"by {current.shard_by!r}" if current.shard_by else "by hash"
        raise ValueError(f"index {index!r} is sharded {way}: ingest it the same way, or use another name")
    if shard_by is None and count is not None and any(int(k) >= count for k in current.keys):
        raise ValueError(f"index {index!r} has more than {count} shards: ingest it with its own --shards")
    if shard_by is None and current.count is not None and count != current.count:
        # Another count would hash a document already in the index to another shard: it would
        # then be in both.
        have = current.count
        raise ValueError(f"index {index!r} has {have} shards: ingest it with --shards {have}")
    return current


def register_sharded(client: redis.Redis, keys: Keys, root: Path, shard_map: shards.ShardMap) -> IndexInfo:
    """Register the logical index over its shards as the registry has them now."""
    found = [indexes.lookup(client, keys, s) for s in shard_map.shards]
    info = shards.logical_info(
        shard_map, [f for f in found if f is not None], path=str(root / shard_map.index)
    )
    shards.register(client, keys, shard_map, info)
    return info


def ingest_sharded(
    settings: Settings,
    paths: list[Path],
    *,
    index_name: str,
    count: int | None = None,
    shard_by: str | None = None,
    index_type: str = "hnsw",
    embedder: Embedder | None = None,
    progress: bool = True,
    meta: Mapping[str, str] | None = None,
) -> ShardedReport:
    """Build the shards of ``index_name`` its documents fall into (``count`` hash shards, or one
    per value of ``shard_by``) and register them together as one index."""
    if (count is None) == (shard_by is None):
        raise ValueError("shard by hash (a count) or by a metadata field, one of them")
    if count is not None and count < 1:
        raise ValueError("a sharded index has at least one shard")
    limit = settings.retrieval.max_shards_per_index
    if count is not None:
        shards.check_shard_count(index_name, (), map(str, range(count)), limit=limit)
    started = time.perf_counter()
    shards.check_logical_name(index_name)
    chunks, files = read_chunks(settings.retrieval, paths, meta)
    parts = split(chunks, index=index_name, count=count, shard_by=shard_by)
    # Refused before the encoder is loaded and anything is embedded or written.
    client, keys = sync_client(settings.redis), Keys(settings.redis.key_prefix)
    current = planned_map(client, keys, index_name, count=count, shard_by=shard_by)
    shards.check_shard_count(index_name, current.keys if current else (), parts, limit=limit)
    builder = VersionBuilder(
        settings,
        embedder or Embedder(settings.retrieval, device=settings.retrieval.ingest_encoder_device),
        progress=progress,
    )
    built: dict[str, IngestReport] = {}
    for key in sorted(parts, key=key_order):
        shard = shards.shard_index(index_name, key)
        files_in = len({document_id(c) for c in parts[key]})
        built[shard] = builder.build(shard, parts[key], index_type=index_type, files=files_in)
    known = set(current.keys if current else ()) | set(parts)
    shard_map = shards.ShardMap(
        index=index_name, shard_by=shard_by, keys=tuple(sorted(known, key=key_order)), count=count
    )
    index_store.write_shard_map(settings.indexes_dir, shard_map)
    info = register_sharded(builder.client, builder.keys, settings.indexes_dir, shard_map)
    return ShardedReport(info, shard_map, built, files, time.perf_counter() - started)
