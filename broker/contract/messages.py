"""The typed contract between the API and the workers: every task payload and every stream event.

The sender builds a model and encodes it; the receiver decodes it, which validates it. Nothing
else crosses a queue or a stream, so a field added here reaches every reader, and a payload
that does not validate raises :class:`ContractError` at the receiver, which says so in its log
(a task is dropped, not retried: a redelivery would fail the same way) or in an ``error`` event.

- Task payloads travel as Celery kwargs: :meth:`encode` gives JSON types only, under the kwarg
  names the tasks always had, so a task queued by the previous release still decodes.
- Stream events are entries ``{type, data}`` of ``ragline:ev:{request_id}``: the event's name
  (the SSE event name too) and its JSON, as clients see it in ``data:``.
- Models are frozen and refuse unknown fields: a field one side has and the other lacks is a
  version mismatch, reported where it is found instead of silently dropped.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from typing import Any, ClassVar, Final, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model
from ragline.broker.errors import RaglineError

# What a client that gives up sends, by nginx's convention; an `error` event with it is a cancel.
CANCELLED_STATUS: Final = 499


class ContractError(RaglineError, ValueError):
    """A payload or event that does not match the contract."""


def _explain(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors())


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# -- parts ------------------------------------------------------------------------------------


class Source(_Model):
    chunk_id: str
    source: str
    title: str = Field(description="The chunk's title path: 'Simple statements › The global statement'.")
    text: str
    score: float = Field(
        description="What ranked it: cosine similarity (dense), BM25 (lexical), fused rank score (hybrid)."
    )
    anchor: str = Field(default="", description="The section's anchor in its file ('global').")


class Citation(_Model):
    """A source the answer cites as ``[marker]``: the prompt numbers its sources from 1."""

    marker: int
    chunk_id: str
    source: str
    title: str
    anchor: str = ""


SOURCES = TypeAdapter(list[Source])


def decode_sources(data: str | bytes) -> list[Source]:
    """A JSON list of sources (as a job record keeps them); raises ContractError."""
    try:
        return SOURCES.validate_json(data)
    except ValidationError as exc:
        raise ContractError(f"malformed sources: {_explain(exc)}") from None


class Usage(_Model):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Timings(_Model):
    queue_ms: float = Field(default=0.0, description="Waiting in the queues (retrieval, then generation).")
    retrieval_ms: float = Field(default=0.0, description="Embedding and search of the batch it was in.")
    generation_ms: float = Field(default=0.0, description="From the prompt's submission to the last token.")
    first_token_ms: float | None = Field(
        default=None, description="From the prompt's submission to the first token (generated answers)."
    )
    total_ms: float = Field(default=0.0, description="What the API (or the job) took, end to end.")
    predicted_wait_ms: float | None = Field(
        default=None, description="Admission's predicted wait for this answer when it was admitted."
    )


class ChatTurn(_Model):
    """An earlier turn of a conversation (the chat endpoint's), put in the prompt before the
    question; a prompt over its budget drops the oldest turns first."""

    role: Literal["user", "assistant"]
    content: str


class Sampling(_Model):
    """How the engine samples one answer; ``None`` leaves the generation worker's setting. The
    API fills in its defaults and bounds (so that they are part of the cache key)."""

    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    # Generation stops before the first of these; the answer does not contain it.
    stop: tuple[str, ...] = ()


class SemanticMatch(_Model):
    """The earlier question whose answer a semantic cache hit serves, and how close it was."""

    question: str = Field(description="The earlier question, as it was asked.")
    similarity: float = Field(description="Cosine similarity of the two questions' embeddings.")


class Degradation(_Model):
    """Why an answer is retrieval-only; its fields are the answer's own (see :class:`Done`)."""

    degraded: bool = True
    degraded_reason: str | None = None
    notice: str | None = None


# -- task payloads ------------------------------------------------------------------------------


class _Task(_Model):
    def encode(self) -> dict[str, Any]:
        """The task's Celery kwargs."""
        return self.model_dump(mode="json")

    @classmethod
    def decode(cls, kwargs: Mapping[str, Any]) -> Self:
        """The payload of a task called with ``kwargs``; raises ContractError."""
        try:
            return cls.model_validate(kwargs)
        except ValidationError as exc:
            raise ContractError(f"{cls.__name__}: {_explain(exc)}") from None


RetrievalMode = Literal["dense", "lexical", "hybrid"]
RETRIEVAL_MODES: tuple[str, ...] = ("dense", "lexical", "hybrid")


class PrefixMatch(_Model):
    """A filter value matching every value that starts with ``prefix``."""

    prefix: str


# A metadata filter: key -> a value (equality), a list (membership) or {"prefix": …}. Keys are a
# chunk's metadata (`path`: its file under what was ingested; `title`: its title path; front
# matter and `ragline ingest --meta` keys); every key must match.
FilterValue = str | list[str] | PrefixMatch
MetadataFilter = dict[str, FilterValue]


def filter_key(flt: MetadataFilter | None) -> str:
    """A stable key for a filter ('' for none): the worker groups a batch's requests by it, and
    the API's result-cache key includes it."""
    if not flt:
        return ""
    plain = {k: v.model_dump() if isinstance(v, PrefixMatch) else v for k, v in flt.items()}
    return json.dumps(plain, sort_keys=True, ensure_ascii=False)


class RetrieveRequest(_Model):
    """One query of a ``ragline.retrieve`` batch."""

    request_id: str
    query: str
    top_k: int
    mode: Literal["rag", "retrieval"]
    index: str
    index_version: str | None = None
    ef_search: int | None = None
    nprobe: int | None = None
    allow_early_exit: bool = True
    enqueued_at: float
    # An async job: the tasks mirror this request's events into its record.
    job_id: str | None = None
    # The API degraded it to retrieval-only; the worker copies these into its `done`.
    degraded: Degradation | None = None
    # None: the worker's default (RAGLINE_RETRIEVAL_MODE).
    retrieval: RetrievalMode | None = None
    filter: MetadataFilter | None = None
    # False: no cap on chunks per section and per file.
    diversity: bool = True
    # A conversation's earlier turns, oldest first; passed on to the generation task.
    history: tuple[ChatTurn, ...] = ()
    sampling: Sampling = Field(default_factory=Sampling)
    # Set when the API's semantic cache is on: the scope (API key, index version, options) whose
    # earlier questions may answer this one (broker/state/semantic_cache.py).
    semantic_scope: str | None = None


class RetrieveTask(_Task):
    """``ragline.retrieve``: a coalesced batch of queries."""

    requests: list[RetrieveRequest]


class GenerateTask(_Task):
    """``ragline.generate``: one request's sources on their way to the engine."""

    request_id: str
    query: str
    sources: list[Source]
    timings: Timings = Field(default_factory=Timings)
    enqueued_at: float
    job_id: str | None = None
    history: tuple[ChatTurn, ...] = ()
    sampling: Sampling = Field(default_factory=Sampling)
    # The shards of a sharded index left out of its sources; the worker copies them into its `done`.
    partial_shards: tuple[str, ...] = ()


class ShardQuery(_Model):
    """One distinct query of a shard search: its embedding (dense and hybrid) travels with it,
    so a query is embedded once however many shards it reaches."""

    query: str
    mode: RetrievalMode
    vector: list[float] | None = None


class SearchShardTask(_Task):
    """``ragline.search_shard``: one group of a retrieval batch (same index, filter and knobs),
    searched on one shard; the reply goes to the Redis list ``reply_to``."""

    search_id: str
    reply_to: str
    shard: str
    queries: list[ShardQuery]
    depth: int = Field(ge=1, description="Candidates per query, as deep as the unsharded search.")
    filter: MetadataFilter | None = None
    ef_search: int | None = None
    nprobe: int | None = None
    # Unix seconds: past this the coordinator has given up, and a shard worker skips the task.
    deadline: float


class ShardChunk(_Model):
    """A chunk as a shard returns it: what ranking, diversity and the sources need."""

    chunk_id: str
    source: str
    title: str
    text: str
    anchors: tuple[str, ...] = ()
    meta: dict[str, str] = Field(default_factory=dict)


class ShardHit(_Model):
    chunk: ShardChunk
    score: float
    dense: float | None = None


class WebhookDelivery(_Task):
    """``ragline.deliver_webhook``: one attempt at delivering a finished job."""

    job_id: str
    attempt: int = Field(ge=1)


# The document types ragline reads (`ragline ingest` and uploads), by how a file's name ends.
DOCUMENT_SUFFIXES: tuple[str, ...] = (".txt", ".md", ".rst", ".rst.txt", ".html", ".htm")
# Longest first, so that ".rst.txt" is not taken for plain text.
_SUFFIXES_LONGEST_FIRST = sorted(DOCUMENT_SUFFIXES, key=len, reverse=True)


def document_type(name: str) -> str | None:
    """The type a file called ``name`` is read as: the longest of :data:`DOCUMENT_SUFFIXES` its
    lowercased name ends with, when a name stands before it (``.md`` or ``..md`` has none: no
    title, and nothing to stage it as); else None. The API's check of an upload and the readers
    both ask this, so a file the API accepts is one a worker reads."""
    lowered = name.lower()
    suffix = next((s for s in _SUFFIXES_LONGEST_FIRST if lowered.endswith(s)), None)
    if suffix is None or not name[: -len(suffix)].strip().strip("."):
        return None
    return suffix


class StagedDocument(_Model):
    """One uploaded document as the API staged it: a file of the upload's folder."""

    id: str = Field(description="The document's id in its index: an upload with the same id replaces it.")
    file: str = Field(description="Its file, relative to the upload's folder (its name keeps the type).")
    metadata: dict[str, str] = Field(default_factory=dict)


class _Json(_Model):
    """A model kept as one JSON string (a stream entry, a file, a record's field)."""

    @classmethod
    def _what(cls) -> str:
        return cls.__name__

    def encode(self) -> str:
        return self.model_dump_json()

    @classmethod
    def decode(cls, data: str | bytes) -> Self:
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            raise ContractError(f"malformed {cls._what()}: {_explain(exc)}") from None


class UploadManifest(_Json):
    """``manifest.json`` of an upload's folder: what the API staged, read by the ingest worker."""

    documents: list[StagedDocument]

    @classmethod
    def _what(cls) -> str:
        return "upload manifest"


class ShardReply(_Json):
    """A shard's answer to :class:`SearchShardTask`: per query (in its order) the candidates,
    best first; ``error`` when the shard could not search (the coordinator counts it missing)."""

    search_id: str
    shard: str
    version: str | None = None
    hits: list[list[ShardHit]] = Field(default_factory=list)
    error: str | None = None

    @classmethod
    def _what(cls) -> str:
        return "shard reply"


IngestOperation = Literal["add", "delete_documents", "delete_index"]


class IngestTask(_Task):
    """``ragline.ingest``: one write to an index (a job of its own), run on the ``ingest`` queue."""

    job_id: str
    index: str
    operation: IngestOperation
    # add: the upload's folder, by name, under the uploads folder (Settings.uploads_dir).
    staging: str | None = None
    # delete_documents: the ids the next version drops.
    document_ids: list[str] = Field(default_factory=list)
    # delete_index: the version the API unregistered (a newer one, made since, is left alone).
    version: str | None = None
    enqueued_at: float


class IngestTurn(_Task):
    """``ragline.ingest_turn``: one turn on the ingest queue, one sent per job. The worker runs
    the oldest job of the next API key in turn (``broker/state/ingest_turns.py``), not
    necessarily the job whose upload sent it: one key's backlog delays another's by one job."""

    enqueued_at: float


class QueuedIngest(_Json):
    """An ingest job waiting its key's turn, or running: kept in Redis until it ends."""

    key: str = Field(description="Whose turn it waits for: the API key id that asked for it.")
    task: IngestTask

    @classmethod
    def _what(cls) -> str:
        return "queued ingest"


class IngestProgress(_Model):
    """Where an ingest job is: the record's ``progress`` while it runs."""

    phase: Literal["reading", "embedding", "indexing", "registering", "removing"]
    chunks_embedded: int = 0
    chunks_total: int = Field(default=0, description="Chunks to embed: the new ones (all, for IVF-PQ).")


class FailedDocument(_Model):
    """A document of an upload that was left out of the new version (a replaced one keeps its
    previous text): its id and why, never a path on the server."""

    id: str
    reason: str


class IngestResult(_Json):
    """A finished ingest job's result: the version it registered (None after a delete of the index)."""

    index: str
    version: str | None
    documents: int = Field(description="Documents in the new version.")
    chunks: int
    added: int = Field(default=0, description="Documents added or replaced.")
    removed: int = Field(default=0, description="Documents dropped (deleted, or replaced by an upload).")
    embedded: int = Field(default=0, description="Chunks embedded for this version (new ones).")
    reused: int = Field(default=0, description="Chunks whose vectors came from the previous version.")
    failed: list[FailedDocument] = Field(
        default_factory=list,
        description="Documents of the upload left out, each with why (past its time limit, say).",
    )

    @classmethod
    def _what(cls) -> str:
        return "ingest result"


# -- stream events ------------------------------------------------------------------------------


class _Event(_Json):
    """Its JSON is the stream entry's ``data`` and the SSE event's ``data:``."""

    type: ClassVar[str]

    @classmethod
    def _what(cls) -> str:
        return f"{cls.type} event"


class Sources(_Event):
    type: ClassVar[str] = "sources"

    sources: list[Source]
    index_version: str | None = None
    # The index they were found in (a reader that resumes a stream learns it here).
    index: str | None = None
    # A sharded index's shards that did not answer within their budget: left out of these sources.
    partial: bool = False
    partial_shards: list[str] = Field(default_factory=list)


class Token(_Event):
    type: ClassVar[str] = "token"

    text: str


class Restart(_Event):
    """The generation starts again from the first token (its task was redelivered after a worker
    stopped mid-answer): a reader drops the tokens it has joined so far. Only tokens after the
    last ``restart`` make up ``done.answer``."""

    type: ClassVar[str] = "restart"

    reason: str = "redelivered"


class Done(_Event):
    """The final answer. The JSON response, the SSE ``done`` event and a job's result are each
    built on this model, so each carries every field of it."""

    type: ClassVar[str] = "done"

    answer: str | None = Field(
        description="The generated answer; the best source's text on an early exit; null when retrieval-only."
    )
    usage: Usage | None = None
    timings: Timings = Field(default_factory=Timings)
    sources_dropped: int = Field(
        default=0,
        description="Sources left out of the prompt, lowest-scored first, to fit RAGLINE_MAX_SOURCE_TOKENS.",
    )
    early_exit: bool = Field(
        default=False,
        description="Answered with the best source, without generating: its score cleared "
        "RAGLINE_EARLY_EXIT_SCORE.",
    )
    degraded: bool = Field(
        default=False, description="Generation was too busy for the deadline: sources only, no answer."
    )
    degraded_reason: str | None = Field(
        default=None, description="Why it was degraded: `generation_busy` or `generation_queue_full`."
    )
    notice: str | None = Field(default=None, description="A human-readable note about a degraded answer.")
    cached: bool | Literal["semantic"] = Field(
        default=False,
        description="Served from the result cache (timings are the original's); `semantic`: the "
        "answer of an earlier question close enough to this one (`semantic_match`).",
    )
    semantic_match: SemanticMatch | None = Field(
        default=None, description="When `cached` is `semantic`: the question whose answer this is."
    )
    citations: list[Citation] = Field(
        default_factory=list, description="The sources the answer cites as [n], in order of first citation."
    )
    finish_reason: Literal["stop", "length"] | None = Field(
        default=None,
        description="Why generation ended: `stop` (end of the answer, or a stop sequence) or `length` "
        "(its max_tokens); null when nothing was generated.",
    )
    partial: bool = Field(
        default=False,
        description="Some shards of a sharded index had no live worker, or did not answer within their "
        "budget: the sources (and the answer) come from the others.",
    )
    partial_shards: list[str] = Field(
        default_factory=list, description="The shards left out, by index name, when `partial`."
    )

    def done_fields(self) -> dict[str, Any]:
        """This answer's :class:`Done` fields (of a Done or of any model built on it)."""
        return {name: getattr(self, name) for name in Done.model_fields}

    @classmethod
    def from_done(cls, done: Done, **fields: Any) -> Self:
        """``cls`` made of ``done``, with ``fields`` over its own.

        ``cls`` is a rendering of an answer (the JSON answer, the SSE ``done``, a job's result,
        the OpenAI extension), a model built on Done: it carries every field of ``done``, so no
        rendering copies Done's fields one by one and a field added to Done reaches every one.
        Should ``done``'s own model have fields that ``cls`` lacks (a model built on Done with
        more), ``cls`` is extended by them. The other way round, ``done`` a rendering and ``cls``
        what it is built on (a cached answer back to its ``done``), only ``cls``'s fields are kept.
        """
        if isinstance(done, cls):
            model, names = cls, cls.model_fields.keys()
        else:
            model, names = _carrying(cls, type(done)), type(done).model_fields.keys()
        return model(**{**{name: getattr(done, name) for name in names}, **fields})


class CachedAnswer(Done):
    """An answer as the result cache keeps it: every field of its ``done``, and its sources (the
    JSON answer without its request id). The semantic cache's lookup reads it back."""

    sources: list[Source]


_D = TypeVar("_D", bound=Done)


@functools.cache
def _carrying(rendering: type[_D], answer: type[Done]) -> type[_D]:
    """``rendering``, extended by the fields of ``answer`` it lacks (none, when it is built on the
    same Done: every rendering is, so outside tests this is ``rendering`` itself)."""
    missing = {
        name: field for name, field in answer.model_fields.items() if name not in rendering.model_fields
    }
    if not missing:
        return rendering
    extra: dict[str, Any] = {name: (field.annotation, copy.copy(field)) for name, field in missing.items()}
    return create_model(rendering.__name__, __base__=rendering, __module__=rendering.__module__, **extra)


class Error(_Event):
    type: ClassVar[str] = "error"

    status: int = Field(description="HTTP-like status: 499 cancelled, 404 unknown index, 5xx failures.")
    message: str


class Cancelled(Error):
    """A cancel: on the wire an ``error`` with status 499, as it always was."""

    status: Literal[499] = CANCELLED_STATUS
    message: str = "cancelled"


StreamEvent = Sources | Token | Restart | Done | Error
FINAL_TYPES = frozenset({Done.type, Error.type})
_EVENTS: dict[str, type[StreamEvent]] = {
    model.type: model for model in (Sources, Token, Restart, Done, Error)
}


def decode_event(type_: str | bytes, data: str | bytes) -> StreamEvent:
    """The event of a stream entry; raises ContractError for an unknown type or bad data."""
    name = type_.decode(errors="replace") if isinstance(type_, bytes) else type_
    model = _EVENTS.get(name)
    if model is None:
        raise ContractError(f"unknown event type {name!r}")
    event = model.decode(data)
    if isinstance(event, Error) and event.status == CANCELLED_STATUS:
        return Cancelled(message=event.message)
    return event
