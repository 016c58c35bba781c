"""POST /v1/jobs (202), GET /v1/jobs/{id}, DELETE /v1/jobs/{id} (cancel)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Header, Request, Response
from ragline.api.deps import DEADLINE, principal_of, validated
from ragline.api.jobs.protocol import JobAccepted, JobRequest, JobView
from ragline.api.jobs.service import JobService
from ragline.api.query.protocol import ErrorBody, json_body

router = APIRouter(prefix="/v1", tags=["jobs"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody},
    404: {"model": ErrorBody},
    409: {"model": ErrorBody},
    413: {"model": ErrorBody},
    422: {"model": ErrorBody},
    429: {"model": ErrorBody},
    503: {"model": ErrorBody},
}


def _service(request: Request) -> JobService:
    return request.app.state.job_service


@router.post(
    "/jobs",
    status_code=202,
    response_model=JobAccepted,
    responses=_ERRORS,
    openapi_extra=json_body(JobRequest),
)
async def create_job(
    request: Request,
    response: Response,
    idempotency_key: str | None = Header(
        default=None, description="The same key within 24 h returns the same job instead of a new one."
    ),
    deadline_ms: str | None = DEADLINE,
) -> JobAccepted:
    """Start a job; poll ``status_url`` or wait for the webhook."""
    ctx = await validated(request, JobRequest, deadline_ms)
    accepted, replayed = await _service(request).submit(
        ctx, principal=principal_of(request), idempotency_key=idempotency_key
    )
    request.state.answered_as = ctx.answered_as
    response.headers["Location"] = accepted.status_url
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return accepted


@router.get("/jobs/{job_id}", response_model=JobView, responses=_ERRORS)
async def get_job(job_id: str, request: Request) -> JobView:
    """Status, timestamps, the result when done, and the webhook's delivery state."""
    return await _service(request).get(principal_of(request), job_id)


@router.delete("/jobs/{job_id}", response_model=JobView, responses=_ERRORS)
async def cancel_job(job_id: str, request: Request) -> JobView:
    """Cancel a job that has not finished (a running generation is aborted); 409 when it has."""
    return await _service(request).cancel(principal_of(request), job_id)
