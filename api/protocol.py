"""Request and response bodies of the query endpoints."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
)

from broker.contract import ChatTurn, Done, MetadataFilter, Source, Timings, Usage

MAX_FILTER_KEYS = 16
MAX_FILTER_VALUES = 256

__all__ = [
    "ErrorBody",
    "QueryRequest",
    "QueryResponse",
    "Source",
    "StreamDone",
    "Timings",
    "Usage",
    "json_body",
]


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
    retrieval: Literal["dense", "lexical", "hybrid"] | None = Field(
        default=None,
        description="`dense` (embeddings), `lexical` (BM25) or `hybrid` (both, fused); the server's "
        "RAGLINE_RETRIEVAL_MODE when omitted.",
    )
    filter: MetadataFilter | None = Field(
        default=None,
        description='Metadata every source must match: key -> a value, a list of values, or {"prefix": …}. '
        "Keys: `path` (the file under what was ingested), `title`, front matter and `ingest --meta` keys.",
    )
    diversity: StrictBool = Field(
        default=True,
        description="Cap the chunks of one section and of one file in the sources "
        "(RAGLINE_MAX_CHUNKS_PER_SECTION / _PER_FILE); false turns it off.",
    )
    history: list[ChatTurn] = Field(
        default_factory=list,
        description="A conversation's earlier turns, oldest first (`{role: user|assistant, content}`), "
        "put in the prompt before the question: the most recent RAGLINE_MAX_HISTORY_TURNS, the oldest "
        "dropped first to fit RAGLINE_MAX_HISTORY_TOKENS and the model's length. Retrieval searches "
        "for `query` only.",
    )
    max_tokens: StrictInt | None = Field(
        default=None,
        description="The answer's token limit; RAGLINE_MAX_NEW_TOKENS when omitted, and at most it.",
    )
    temperature: StrictInt | StrictFloat | None = Field(
        default=None,
        description="Sampling temperature, 0 (greedy) to RAGLINE_MAX_TEMPERATURE; RAGLINE_TEMPERATURE "
        "when omitted.",
    )
    stop: list[StrictStr] | None = Field(
        default=None,
        description="Up to RAGLINE_MAX_STOP_SEQUENCES strings: the answer ends before the first of them.",
    )

    @field_validator("filter")
    @classmethod
    def _bounded_filter(cls, value: MetadataFilter | None) -> MetadataFilter | None:
        if value is None:
            return None
        if not value or len(value) > MAX_FILTER_KEYS:
            raise ValueError(f"a filter has 1 to {MAX_FILTER_KEYS} keys")
        for key, wanted in value.items():
            if not key:
                raise ValueError("filter keys are non-empty")
            if isinstance(wanted, list) and not 1 <= len(wanted) <= MAX_FILTER_VALUES:
                raise ValueError(f"filter {key!r}: a list has 1 to {MAX_FILTER_VALUES} values")
        return value


class QueryResponse(Done):
    """The JSON answer: every field of the request's `done` event, with its id and sources."""

    request_id: str
    sources: list[Source]


class StreamDone(Done):
    """The stream's ``done`` event as the API sends it: the worker's, with the request's id."""

    request_id: str


class ErrorBody(BaseModel):
    error: str
    message: str
    request_id: str | None = None


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of a route that hands its raw body to the pipeline's validate
    step (one validation, one set of messages, for every endpoint): ``model``'s schema."""
    schema = model.model_json_schema()
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
