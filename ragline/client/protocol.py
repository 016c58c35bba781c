"""The API's bodies as this client writes and reads them: pydantic models and nothing else, so
that ``pip install "ragline[client]"`` needs no part of the server.

They mirror the server's models field for field (``api/*/protocol.py`` and
``broker/contract/messages.py``, under the same class names); tests/ragline/client/test_protocol.py
holds them to it. Requests refuse unknown fields, as the server does, so a misspelt option fails
here before it is sent. Responses ignore fields they do not know: a newer server's additions
do not break an older client.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

# -- requests -------------------------------------------------------------------------------------


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PrefixMatch(_Request):
    """A filter value matching every value that starts with ``prefix``."""

    prefix: str


# A metadata filter: key -> a value (equality), a list (membership) or {"prefix": …}.
FilterValue = str | list[str] | PrefixMatch
MetadataFilter = dict[str, FilterValue]


class ChatTurn(_Request):
    """An earlier turn of a conversation, put in the prompt before the question."""

    role: Literal["user", "assistant"]
    content: str


class QueryRequest(_Request):
    """``POST /v1/query`` and ``/v1/query/stream``; the server's defaults for what is not set."""

    query: StrictStr
    top_k: StrictInt | None = None
    mode: Literal["rag", "retrieval"] = "rag"
    index: StrictStr | None = None
    ef_search: StrictInt | None = None
    nprobe: StrictInt | None = None
    abort_on_disconnect: bool = True
    allow_early_exit: bool = True
    allow_degraded: StrictBool = True
    retrieval: Literal["dense", "lexical", "hybrid"] | None = None
    filter: MetadataFilter | None = None
    diversity: StrictBool = True
    history: list[ChatTurn] = Field(default_factory=list)
    max_tokens: StrictInt | None = None
    temperature: StrictInt | StrictFloat | None = None
    stop: list[StrictStr] | None = None


class JobRequest(QueryRequest):
    """``POST /v1/jobs``: a query, and where its answer goes."""

    webhook_url: StrictStr | None = None
    metadata: dict[str, Any] | None = None


# -- responses: an answer and its parts ---------------------------------------------------------


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Source(_Response):
    chunk_id: str
    source: str
    title: str  # the chunk's title path: 'Simple statements › The global statement'
    text: str
    score: float  # cosine similarity (dense), BM25 (lexical) or the fused rank score (hybrid)
    anchor: str = ""  # the section's anchor in its file


class Citation(_Response):
    """A source the answer cites as ``[marker]`` (the prompt numbers its sources from 1)."""

    marker: int
    chunk_id: str
    source: str
    title: str
    anchor: str = ""


class SemanticMatch(_Response):
    """The earlier question whose answer a semantic cache hit serves, and how close it was."""

    question: str
    similarity: float  # cosine similarity of the two questions' embeddings


class Usage(_Response):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Timings(_Response):
    queue_ms: float = 0.0
    retrieval_ms: float = 0.0
    generation_ms: float = 0.0
    first_token_ms: float | None = None
    total_ms: float = 0.0
    predicted_wait_ms: float | None = None


class Done(_Response):
    """The final answer: the JSON response, the stream's ``done`` and a job's result each carry
    every field of it."""

    answer: str | None  # null when retrieval-only; the best source's text on an early exit
    usage: Usage | None = None
    timings: Timings = Field(default_factory=Timings)
    sources_dropped: int = 0  # left out of the prompt to fit RAGLINE_MAX_SOURCE_TOKENS
    early_exit: bool = False
    degraded: bool = False  # generation was too busy for the deadline: sources only
    degraded_reason: str | None = None
    notice: str | None = None
    cached: bool | Literal["semantic"] = False  # "semantic": another question's answer (semantic_match)
    semantic_match: SemanticMatch | None = None
    citations: list[Citation] = Field(default_factory=list)
    finish_reason: Literal["stop", "length"] | None = None
    partial: bool = False  # some shards of a sharded index did not answer
    partial_shards: list[str] = Field(default_factory=list)


class QueryResponse(Done):
    """``POST /v1/query``'s answer."""

    request_id: str
    sources: list[Source]


class StreamDone(Done):
    """A stream's ``done`` event: every field of the answer but its sources."""

    request_id: str


# -- responses: stream events (the ``data:`` of each SSE event) ----------------------------------


class Sources(_Response):
    sources: list[Source]
    index_version: str | None = None
    index: str | None = None
    partial: bool = False
    partial_shards: list[str] = Field(default_factory=list)


class Token(_Response):
    text: str


class Restart(_Response):
    reason: str = "redelivered"


class Error(_Response):
    status: int  # HTTP-like: 499 cancelled, 404 unknown index, 5xx failures
    message: str


# -- responses: jobs ----------------------------------------------------------------------------

JobStatus = Literal["queued", "retrieving", "generating", "ingesting", "done", "failed", "cancelled"]
DeliveryStatus = Literal["pending", "scheduled", "delivering", "delivered", "gone", "dead"]
IngestOperation = Literal["add", "delete_documents", "delete_index"]


class JobAccepted(_Response):
    job_id: str
    status: JobStatus
    status_url: str


class JobQuery(QueryRequest):
    """A query job's request as the server keeps it: every field, ``top_k`` and ``index`` as it ran."""

    model_config = ConfigDict(extra="ignore", frozen=True)  # a newer server's fields

    top_k: int
    index: str


class IngestRequest(_Response):
    index: str
    operation: IngestOperation
    documents: list[str] = Field(default_factory=list)


class JobResult(Done):
    """A finished query job's answer."""

    sources: list[Source]


class IngestProgress(_Response):
    phase: Literal["reading", "embedding", "indexing", "registering", "removing"]
    chunks_embedded: int = 0
    chunks_total: int = 0


class FailedDocument(_Response):
    """A document of an upload left out of the new version, and why."""

    id: str
    reason: str


class IngestResult(_Response):
    """A finished ingest job: the index's new version and what changed in it."""

    index: str
    version: str | None
    documents: int
    chunks: int
    added: int = 0
    removed: int = 0
    embedded: int = 0
    reused: int = 0
    failed: list[FailedDocument] = Field(default_factory=list)


class WebhookAttempt(_Response):
    attempt: int
    at: str | None = None
    status_code: int | None = None
    error: str | None = None
    duration_ms: float | None = None


class WebhookState(_Response):
    delivery_id: str
    status: DeliveryStatus
    attempts: int
    next_attempt_at: str | None = None
    last_attempt: WebhookAttempt | None = None
    delivered_at: str | None = None
    dead_lettered_at: str | None = None


class JobView(_Response):
    """``GET /v1/jobs/{id}``: a query job or an index change, its state and, once done, its result."""

    job_id: str
    kind: Literal["query", "ingest"] = "query"
    status: JobStatus
    created_at: str
    updated_at: str
    timestamps: dict[str, str]
    request: JobQuery | IngestRequest
    metadata: dict[str, Any] | None = None
    webhook_url: str | None = None
    result: JobResult | IngestResult | None = None
    error: Error | None = None
    progress: IngestProgress | None = None
    webhook: WebhookState | None = None


# -- responses: indexes and documents -----------------------------------------------------------


class IndexSummary(_Response):
    name: str
    version: str
    documents: int | None
    chunks: int
    index_type: str  # hnsw, ivfpq, ivfpq-disk or sharded
    default: bool
    shards: int | None = None


class IndexList(_Response):
    indexes: list[IndexSummary]
    default_index: str


class IndexDetail(IndexSummary):
    bytes: int | None
    dim: int
    shard_of: str | None = None


class DocumentSummary(_Response):
    id: str
    title: str
    path: str
    chunks: int


class DocumentList(_Response):
    index: str
    version: str
    total: int
    documents: list[DocumentSummary]
    next_after: str | None = None
