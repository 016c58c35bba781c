"""What a client asks: the bodies of ``POST /v1/query`` (and its stream) and ``POST /v1/jobs``.

In the contract because a job's record keeps the request whole (:mod:`.records`): the API
validates it here, the job record stores it, the workers' callbacks send it back in the webhook
body, and a field added here reaches all of them (and the Idempotency-Key's fingerprint).
"""

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
from ragline.broker.contract.messages import ChatTurn, MetadataFilter

MAX_FILTER_KEYS = 16
MAX_FILTER_VALUES = 256


class QueryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

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


class JobRequest(QueryRequest):
    """``POST /v1/jobs``: a query, and where its result goes."""

    webhook_url: StrictStr | None = Field(
        default=None,
        description="http(s) URL that receives the job's final JSON, signed (see docs/webhooks.md). "
        "It must resolve to public addresses only.",
    )
    metadata: dict[str, Any] | None = Field(
        default=None,
        description="Any JSON object, echoed back in the job and its webhook "
        "(at most RAGLINE_JOB_METADATA_MAX_BYTES serialised).",
    )
