"""GET /v1/indexes and GET /v1/indexes/{name}: what the registry in Redis holds, nothing loaded."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.errors import ApiError
from api.indexes_protocol import IndexDetail, IndexList, IndexSummary
from api.protocol import ErrorBody
from broker import indexes
from broker.keys import Keys

router = APIRouter(prefix="/v1", tags=["indexes"])

_ERRORS = {401: {"model": ErrorBody}, 404: {"model": ErrorBody}, 429: {"model": ErrorBody}}


@router.get("/indexes", response_model=IndexList, responses=_ERRORS)
async def list_indexes(request: Request) -> IndexList:
    """Every index, with the version it answers from and its document and chunk counts."""
    settings = request.app.state.settings
    found = await indexes.alist(request.app.state.redis, Keys(settings.redis.key_prefix))
    default = settings.retrieval.default_index
    return IndexList(
        indexes=[
            IndexSummary.of(info, default_index=default) for info in sorted(found, key=lambda i: i.name)
        ],
        default_index=default,
    )


@router.get("/indexes/{name}", response_model=IndexDetail, responses=_ERRORS)
async def get_index(name: str, request: Request) -> IndexDetail:
    """One index's current version: documents, chunks, size on disk, index type."""
    settings = request.app.state.settings
    info = await indexes.alookup(request.app.state.redis, Keys(settings.redis.key_prefix), name)
    if info is None:
        raise ApiError(404, "unknown_index", f"index {name!r} does not exist; ingest it first")
    return IndexDetail.of(info, default_index=settings.retrieval.default_index)
