"""Request and response bodies of the async jobs endpoints.

The request and the job's view are the contract's (:mod:`ragline.broker.contract.requests`,
:mod:`ragline.broker.contract.records`): a job's record keeps the request whole, and the
callbacks worker sends the same view as the webhook's body.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from ragline.broker.contract.records import (
    DeliveryStatus,
    IngestRequest,
    JobQuery,
    JobResult,
    JobStatus,
    JobView,
    WebhookAttempt,
    WebhookState,
)
from ragline.broker.contract.requests import JobRequest

__all__ = [
    "DeliveryStatus",
    "IngestRequest",
    "JobAccepted",
    "JobQuery",
    "JobRequest",
    "JobResult",
    "JobStatus",
    "JobView",
    "WebhookAttempt",
    "WebhookState",
]


class JobAccepted(BaseModel):
    job_id: str
    status: JobStatus
    status_url: str = Field(description="Where to poll the job: GET it for status and result.")
