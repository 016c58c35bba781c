"""Request and response bodies of the async jobs endpoints."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from api.protocol import QueryRequest
from broker.contract import Done, IngestOperation, IngestProgress, IngestResult, Source

JobStatus = Literal["queued", "retrieving", "generating", "ingesting", "done", "failed", "cancelled"]
DeliveryStatus = Literal["pending", "scheduled", "delivering", "delivered", "gone", "dead"]


class JobRequest(QueryRequest):
    model_config = ConfigDict(extra="forbid")

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


class JobAccepted(BaseModel):
    job_id: str
    status: JobStatus
    status_url: str = Field(description="Where to poll the job: GET it for status and result.")


class JobQuery(BaseModel):
    query: str
    top_k: int
    mode: Literal["rag", "retrieval"]
    index: str


class IngestRequest(BaseModel):
    """What an ingest job changes (documents uploaded or deleted over HTTP)."""

    index: str
    operation: IngestOperation
    documents: list[str] = Field(default_factory=list, description="The ids it adds, replaces or deletes.")


class JobResult(Done):
    """A finished job's answer: every field of its `done` event, with its sources."""

    sources: list[Source]


class JobError(BaseModel):
    status: int = Field(description="HTTP-like status: 499 cancelled, 404 unknown index, 5xx failures.")
    message: str


class WebhookAttempt(BaseModel):
    attempt: int
    at: str
    status_code: int | None = None
    error: str | None = None
    duration_ms: float | None = None


class WebhookState(BaseModel):
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


class JobView(BaseModel):
    job_id: str
    kind: Literal["query", "ingest"] = Field(
        default="query", description="A query (POST /v1/jobs) or a change to an index's documents."
    )
    status: JobStatus
    created_at: str
    updated_at: str
    timestamps: dict[str, str] = Field(description="When the job entered each status it went through.")
    request: JobQuery | IngestRequest
    metadata: dict[str, Any] | None = None
    webhook_url: str | None = None
    result: JobResult | IngestResult | None = Field(default=None, description="Present when the job is done.")
    progress: IngestProgress | None = Field(
        default=None, description="An ingest job's progress: chunks embedded of the total."
    )
    error: JobError | None = Field(default=None, description="Present when it failed or was cancelled.")
    webhook: WebhookState | None = None
