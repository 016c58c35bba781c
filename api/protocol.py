"""Request and response bodies of the query endpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr


class QueryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: StrictStr = Field(description="The question; non-empty, at most RAGLINE_MAX_QUERY_BYTES of UTF-8.")
    top_k: StrictInt | None = Field(default=None, description="How many sources to retrieve (1..50).")
    mode: Literal["rag", "retrieval"] = Field(
        default="rag", description="`rag` generates an answer; `retrieval` returns the sources only."
    )
    index: StrictStr | None = Field(default=None, description="Index name; the default index when omitted.")
    ef_search: StrictInt | None = Field(
        default=None, description="HNSW search effort for this query (bounded)."
    )
    nprobe: StrictInt | None = Field(default=None, description="IVF lists probed for this query (bounded).")
    abort_on_disconnect: bool = Field(
        default=True,
        description="Streams: stop generating when the client disconnects. Set false to reconnect "
        "later with Last-Event-ID and find the whole answer.",
    )
    allow_early_exit: bool = Field(
        default=True,
        description="Let the server answer with the best source, without generating, when it clears "
        "RAGLINE_EARLY_EXIT_SCORE (off unless that is set).",
    )
    allow_degraded: StrictBool = Field(
        default=True,
        description="When generation cannot meet the deadline, answer with the sources only "
        "(`degraded: true`) instead of 503.",
    )


class Source(BaseModel):
    chunk_id: str
    source: str
    title: str
    text: str
    score: float


class Timings(BaseModel):
    queue_ms: float = 0.0
    retrieval_ms: float = 0.0
    generation_ms: float = 0.0
    total_ms: float = 0.0
    predicted_wait_ms: float | None = Field(
        default=None, description="Admission's predicted wait for this answer when it was admitted."
    )


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class QueryResponse(BaseModel):
    request_id: str
    answer: str | None
    sources: list[Source]
    degraded: bool = Field(
        default=False, description="Generation was too busy for the deadline: sources only, no answer."
    )
    degraded_reason: str | None = Field(
        default=None, description="Why it was degraded: `generation_busy` or `generation_queue_full`."
    )
    notice: str | None = Field(default=None, description="A human-readable note about a degraded answer.")
    cached: bool = Field(
        default=False, description="Served from the result cache (timings are the original's)."
    )
    timings: Timings
    usage: Usage | None = None


class ErrorBody(BaseModel):
    error: str
    message: str
    request_id: str | None = None
