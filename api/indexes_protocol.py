"""Response bodies of the index endpoints (what the registry records of each index's version)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

if TYPE_CHECKING:  # the client imports these models; it needs no Redis
    from broker.indexes import IndexInfo


class IndexSummary(BaseModel):
    name: str
    version: str = Field(description="The version queries are answered from now.")
    documents: int | None = Field(
        description="Documents in this version; null when it was ingested before ragline recorded it."
    )
    chunks: int
    index_type: str = Field(description="`hnsw`, `ivfpq` or `ivfpq-disk`.")
    default: bool = Field(description="Queries that name no index use this one.")

    @classmethod
    def of(cls, info: IndexInfo, *, default_index: str) -> IndexSummary:
        return cls(
            name=info.name,
            version=info.version,
            documents=info.documents,
            chunks=info.chunks,
            index_type=info.index_type,
            default=info.name == default_index,
        )


class IndexList(BaseModel):
    indexes: list[IndexSummary] = Field(description="By name.")
    default_index: str = Field(
        description="The index a query that names none is asked (it may not exist yet)."
    )


class IndexDetail(IndexSummary):
    bytes: int | None = Field(
        description="The version's files on disk (vectors and chunks); null when not recorded."
    )
    dim: int = Field(description="The embedding's dimensions.")

    @classmethod
    def of(cls, info: IndexInfo, *, default_index: str) -> IndexDetail:
        summary = IndexSummary.of(info, default_index=default_index)
        return cls(**summary.model_dump(), bytes=info.bytes, dim=info.dim)
