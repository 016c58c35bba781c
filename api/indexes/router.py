"""GET /v1/indexes and GET /v1/indexes/{name}: what the registry in Redis holds, nothing loaded.

A sharded index is listed once, as the one index queries see; its shards (``NAME.shard-KEY``,
ordinary indexes in the registry) are not, but each can be asked for by name: an operator
checking one shard's version or size, which the logical entry sums away.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from ragline.api.errors import ApiError
from ragline.api.indexes.protocol import IndexDetail, IndexList, IndexSummary
from ragline.api.query.protocol import ErrorBody
from ragline.broker.redis.keys import Keys
from ragline.broker.state import indexes, shards

router = APIRouter(prefix="/v1", tags=["indexes"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody},
    404: {"model": ErrorBody},
    429: {"model": ErrorBody},
}


@router.get("/indexes", response_model=IndexList, responses=_ERRORS)
async def list_indexes(request: Request) -> IndexList:
    """Every index, with the version it answers from and its document and chunk counts; a sharded
    index once, with its shard count, and not its shards."""
    settings = request.app.state.settings
    client, keys = request.app.state.redis, Keys(settings.redis.key_prefix)
    found = await indexes.alist(client, keys)
    maps = {m.index: m for m in await shards.alist(client, keys)}
    default = settings.retrieval.default_index
    return IndexList(
        indexes=[
            IndexSummary.of(
                info,
                default_index=default,
                shards=len(maps[info.name].keys) if info.name in maps else None,
            )
            for info in sorted(found, key=lambda i: i.name)
            # By name, as queries are refused: a shard whose map is gone is no index either.
            if shards.split_shard(info.name) is None
        ],
        default_index=default,
    )


@router.get("/indexes/{name}", response_model=IndexDetail, responses=_ERRORS)
async def get_index(name: str, request: Request) -> IndexDetail:
    """One index's current version: documents, chunks, size on disk, index type; a shard's own,
    with the sharded index it is part of."""
    settings = request.app.state.settings
    client, keys = request.app.state.redis, Keys(settings.redis.key_prefix)
    info = await indexes.alookup(client, keys, name)
    if info is None:
        raise ApiError(404, "unknown_index", f"index {name!r} does not exist; ingest it first")
    shard_map = await shards.alookup(client, keys, name) if info.index_type == shards.SHARDED_TYPE else None
    parent = await shards.ashard_of(client, keys, name)
    return IndexDetail.of(
        info,
        default_index=settings.retrieval.default_index,
        shards=len(shard_map.keys) if shard_map else None,
        shard_of=parent.index if parent else None,
    )
