"""Response bodies of the index endpoints (what the registry records of each index's version)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

if TYPE_CHECKING:  # the client imports these models; it needs no Redis
    from ragline.broker.contract.records import IndexInfo


class IndexSummary(BaseModel):
    name: str
    version: str = Field(description="The version queries are answered from now.")
    documents: int | None = Field(
        description="Documents in this version; null when it was ingested before ragline recorded it."
    )
    chunks: int
    index_type: str = Field(
        description="`hnsw`, `ivfpq`, `ivfpq-disk`, or `sharded` (its shards' counts summed)."
    )
    default: bool = Field(description="Queries that name no index use this one.")
    shards: int | None = Field(
        default=None, description="A sharded index's shard count; null for any other index."
    )

    @classmethod
    def of(cls, info: IndexInfo, *, default_index: str, shards: int | None = None) -> IndexSummary:
        return cls(
            name=info.name,
            version=info.version,
            documents=info.documents,
            chunks=info.chunks,
            index_type=info.index_type,
            default=info.name == default_index,
            shards=shards,
        )


class IndexList(BaseModel):
    indexes: list[IndexSummary] = Field(
        description="By name; a sharded index once, not its shards (GET /v1/indexes/{shard} shows one)."
    )
    default_index: str = Field(
        description="The index a query that names none is asked (it may not exist yet)."
    )


class IndexDetail(IndexSummary):
    bytes: int | None = Field(
        description="The version's files on disk (vectors and chunks); null when not recorded."
    )
    dim: int = Field(description="The embedding's dimensions.")
    shard_of: str | None = Field(
        default=None,
        description="For a shard (`NAME.shard-KEY`): the sharded index it is part of; null otherwise.",
    )

    @classmethod
    def of(
        cls, info: IndexInfo, *, default_index: str, shards: int | None = None, shard_of: str | None = None
    ) -> IndexDetail:
        summary = IndexSummary.of(info, default_index=default_index, shards=shards)
        return cls(**summary.model_dump(), bytes=info.bytes, dim=info.dim, shard_of=shard_of)
