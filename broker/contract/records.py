"""Records kept in Redis, and what a job is shown as: the index registry's entries, sharded
indexes' maps, async jobs' records, and a job's view (the body of ``GET /v1/jobs/{id}`` and of
its webhook).

Each is a model, decoded where it is read, like the stream events and task payloads of
:mod:`.messages`, but leniently: a record outlives the release that wrote it and is read by every
release sharing the Redis, so a field a newer release added is ignored, and a field an older
release did not write takes its default. (An event or a task payload is read by the release of
its time, and refuses what it does not know; so do the events a job record keeps, its ``result``
and ``error``.) A record that does not decode raises
:class:`~ragline.broker.contract.messages.ContractError`.
"""

from __future__ import annotations

import functools
import json
import types
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal, Self, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError
from ragline.broker.contract.messages import (
    ContractError,
    Done,
    Error,
    IngestOperation,
    IngestProgress,
    IngestResult,
    Source,
    _explain,
    _Json,
)
from ragline.broker.contract.requests import QueryRequest


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Record(_Json):
    """A record kept as one JSON string (a hash field, a file); fields it does not know (written
    by a later release) are ignored, not refused."""

    model_config = ConfigDict(extra="ignore", frozen=True)


# -- indexes ------------------------------------------------------------------------------------


class IndexInfo(_Record):
    """One version of an index: its entry in the registry (``Keys.indexes``, by name) and its
    ``meta.json`` beside its files."""

    name: str
    version: str
    path: str = Field(description="The version's folder.")
    chunks: int
    dim: int = Field(description="The embedding's dimensions.")
    index_type: str = "hnsw"
    # Recorded at ingest; None for a version ingested before they were (its registry entry or
    # meta.json lacks them).
    documents: int | None = None
    bytes: int | None = Field(default=None, description="The version's files on disk: vectors and chunks.")

    @classmethod
    def _what(cls) -> str:
        return "index entry"


class ShardMapRecord(_Record):
    """A sharded index's map (``Keys.shard_maps``, by the index's name, and a file beside its
    shards): what :class:`ragline.broker.state.shards.ShardMap` routes by."""

    index: str
    shard_by: str | None = Field(
        description="The metadata field holding each chunk's shard key; null: the hash of its document id."
    )
    keys: tuple[str, ...]
    count: int | None = Field(
        default=None,
        description="Sharded by hash: how many shards the hash spreads over (some may hold nothing yet, "
        "so the keys do not tell). Null when sharded by a field, or for a map written before it was kept.",
    )

    @classmethod
    def _what(cls) -> str:
        return "shard map"


# -- jobs ---------------------------------------------------------------------------------------

JobKind = Literal["query", "ingest"]
JobStatus = Literal["queued", "retrieving", "generating", "ingesting", "done", "failed", "cancelled"]
DeliveryStatus = Literal["pending", "scheduled", "delivering", "delivered", "gone", "dead"]
# In the order a job goes through them: its view's timestamps are listed so.
STATUSES: tuple[JobStatus, ...] = get_args(JobStatus)


class JobQuery(QueryRequest):
    """A query job's request, as its record keeps it: every field of the request as validated
    (a field the client left out at its default), with ``top_k`` and ``index`` as the job runs
    them (the server's defaults named). A record from before the request was kept whole has only
    ``query``, ``top_k``, ``mode`` and ``index``; read back, its other fields show their defaults."""

    model_config = ConfigDict(extra="ignore")

    top_k: int = Field(description="How many sources it retrieves.")
    index: str = Field(description="The index it asks.")


class IngestRequest(_Lenient):
    """What an ingest job changes (documents uploaded or deleted over HTTP)."""

    index: str
    operation: IngestOperation
    documents: list[str] = Field(default_factory=list, description="The ids it adds, replaces or deletes.")


class WebhookAttempt(_Lenient):
    attempt: int
    at: str | None = None
    status_code: int | None = None
    error: str | None = None
    duration_ms: float | None = None


class JobRecord(_Lenient):
    """An async job: the Redis hash ``ragline:job:{id}``.

    Each field of the hash holds its value's JSON, a text field its text; :meth:`encode` and
    :meth:`decode` convert. The Lua scripts beside ``broker/state/jobs.py`` and ``webhooks.py``
    move ``status``, the ``{status}_at`` times and the delivery fields; the tasks set
    ``sources``, ``progress``, then ``result`` or ``error``.
    """

    id: str
    owner: str = Field(description="The principal (API key id) whose job it is.")
    kind: JobKind = "query"
    status: JobStatus = "queued"
    # What the job's stages are: a rag query generates, a retrieval one (or a degraded rag one) not.
    mode: Literal["rag", "retrieval", "ingest"] = "rag"
    created_at: float
    updated_at: float
    queued_at: float | None = None
    retrieving_at: float | None = None
    generating_at: float | None = None
    ingesting_at: float | None = None
    done_at: float | None = None
    failed_at: float | None = None
    cancelled_at: float | None = None
    request: JobQuery | IngestRequest
    metadata: dict[str, Any] | None = None
    fingerprint: str | None = Field(default=None, description="What an Idempotency-Key replay must match.")
    sources: list[Source] | None = None
    result: Done | IngestResult | None = None
    error: Error | None = None
    progress: IngestProgress | None = None
    webhook_url: str | None = None
    # One id per job's delivery, the same on every attempt: receivers dedupe on it.
    delivery_id: str | None = None
    delivery_status: DeliveryStatus | None = None
    delivery_attempts: int | None = None
    delivery_last: WebhookAttempt | None = None
    delivery_next_at: float | None = None
    # Attempts put off without reaching the receiver (its host's slots or the resolver were full).
    delivery_deferrals: int | None = None
    # The attempt a callbacks task holds, and until when (another may take it over after).
    delivery_inflight: int | None = None
    delivery_lease_until: float | None = None
    delivered_at: float | None = None
    dead_at: float | None = None

    def encode(self) -> dict[str, str]:
        """The hash's fields (those set)."""
        dumped = self.model_dump(mode="json")
        text = _text_fields(type(self))
        return {
            name: value if name in text else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
            for name, value in dumped.items()
            if value is not None
        }

    @classmethod
    def decode(
        cls, raw: Mapping[bytes | str, bytes | str] | Mapping[bytes, bytes] | Mapping[str, str]
    ) -> Self:
        """The record of a hash as Redis returns it; ContractError when it does not decode."""
        text = _text_fields(cls)
        fields: dict[str, Any] = {}
        for key, value in raw.items():
            name = key.decode() if isinstance(key, bytes) else key
            data = value.decode() if isinstance(value, bytes) else value
            fields[name] = data if name in text else _json_or_text(data)
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise ContractError(f"malformed job record: {_explain(exc)}") from None

    def at(self, status: JobStatus) -> float | None:
        """When the job entered ``status`` (None if it has not)."""
        value: float | None = getattr(self, f"{status}_at")
        return value


def _json_or_text(data: str) -> Any:
    # What is not JSON is left for the model to refuse, with the field's name.
    try:
        return json.loads(data)
    except ValueError:
        return data


@functools.cache
def _text_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields kept as their text (strings, and Literals of them), not as JSON."""

    def text(annotation: Any) -> bool:
        if get_origin(annotation) in (Union, types.UnionType):
            return all(text(a) for a in get_args(annotation) if a is not type(None))
        return annotation is str or get_origin(annotation) is Literal

    return frozenset(name for name, field in model.model_fields.items() if text(field.annotation))


# -- a job's view -------------------------------------------------------------------------------


def iso(ts: float) -> str:
    """Unix seconds as the views show them: ``2026-01-01T12:00:00.000Z``."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _iso(ts: float | None) -> str | None:
    return None if ts is None else iso(ts)


class JobResult(Done):
    """A finished job's answer: every field of its `done` event, with its sources."""

    sources: list[Source]


class WebhookState(_Lenient):
    delivery_id: str = Field(description="The X-Ragline-Delivery header: the same on every attempt.")
    status: DeliveryStatus = Field(
        description="pending (job running), scheduled, delivering, delivered, gone (the receiver "
        "answered 410: no more attempts), dead (every attempt failed: dead-lettered)."
    )
    attempts: int
    next_attempt_at: str | None = None
    last_attempt: WebhookAttempt | None = None
    delivered_at: str | None = None
    dead_lettered_at: str | None = None

    @classmethod
    def of(cls, record: JobRecord) -> WebhookState | None:
        if not record.webhook_url:
            return None
        status = record.delivery_status or "pending"
        return cls(
            delivery_id=record.delivery_id or "",
            status=status,
            attempts=record.delivery_attempts or 0,
            next_attempt_at=_iso(record.delivery_next_at) if status == "scheduled" else None,
            last_attempt=record.delivery_last,
            delivered_at=_iso(record.delivered_at),
            dead_lettered_at=_iso(record.dead_at),
        )


class JobView(_Lenient):
    """A job as ``GET /v1/jobs/{id}`` shows it; its webhook's body is the same but ``webhook``.
    Receivers of webhooks parse it: fields are only ever added to it."""

    job_id: str
    kind: JobKind = Field(
        default="query", description="A query (POST /v1/jobs) or a change to an index's documents."
    )
    status: JobStatus
    created_at: str
    updated_at: str
    timestamps: dict[str, str] = Field(description="When the job entered each status it went through.")
    request: JobQuery | IngestRequest = Field(
        description="A query job's request, every field of it (`top_k` and `index` as it ran), or "
        "what an ingest job changes."
    )
    metadata: dict[str, Any] | None = None
    webhook_url: str | None = None
    # Serialised as what it is: an answer of a model with more fields than JobResult keeps them.
    result: SerializeAsAny[JobResult] | IngestResult | None = Field(
        default=None, description="Present when the job is done."
    )
    error: Error | None = Field(default=None, description="Present when it failed or was cancelled.")
    progress: IngestProgress | None = Field(
        default=None, description="An ingest job's progress: chunks embedded of the total."
    )
    webhook: WebhookState | None = None

    @classmethod
    def of(cls, record: JobRecord, *, delivery: bool = True) -> JobView:
        return cls(
            job_id=record.id,
            kind=record.kind,
            status=record.status,
            created_at=iso(record.created_at),
            updated_at=iso(record.updated_at),
            timestamps={s: iso(at) for s in STATUSES if (at := record.at(s)) is not None},
            request=record.request,
            metadata=record.metadata,
            webhook_url=record.webhook_url,
            result=_result(record) if record.status == "done" else None,
            error=record.error,
            progress=record.progress if record.kind == "ingest" else None,
            webhook=WebhookState.of(record) if delivery else None,
        )

    def webhook_body(self) -> bytes:
        """The body of the job's webhook: the view without its delivery state."""
        return self.model_dump_json(exclude={"webhook"}).encode()


def _result(record: JobRecord) -> JobResult | IngestResult | None:
    """A finished job's result: an ingest job's, or a query's `done` (every field of it) with its
    sources, and the job's own total: from its creation to its end."""
    done = record.result
    if not isinstance(done, Done):
        return done
    timings = done.timings
    if record.done_at is not None:
        timings = timings.model_copy(update={"total_ms": (record.done_at - record.created_at) * 1000})
    return JobResult.from_done(done, sources=record.sources or [], timings=timings)
